#include "common.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>

namespace plk {

namespace {
std::atomic<int> g_threads{0};
std::atomic<int> g_policy{0};
std::atomic<int> g_openmp{0};

// The OpenMP form of a job (benchmarks only: the A/B against the pool): contiguous ranges of the
// same chunks, one per thread, in one region with its join barrier.
void openmp_run(RangeFn fn, void* ctx, int64_t n, int64_t chunk, int64_t chunks, int threads) {
  const int t = static_cast<int>(std::min<int64_t>(threads, chunks));
#pragma omp parallel num_threads(t)
  {
    const int id = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t c0 = chunks * id / nt, c1 = chunks * (id + 1) / nt;
    const int64_t b = c0 * chunk, e = std::min(n, c1 * chunk);
    if (b < e) fn(ctx, b, e);
  }
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  int n = CPU_COUNT(&set);
  return n < 1 ? 1 : n;
}

struct CpuInit {
  CpuInit() { __builtin_cpu_init(); }
} g_cpu_init;
}  // namespace

bool cpu_has_avx2_fma() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool cpu_has_avx512_vnni() {
  return cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
}

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n >= 1) return n;
  static const int cpus = affinity_cpus();
  return cpus;
}

void set_num_threads(int n) { g_threads.store(n < 1 ? 0 : n, std::memory_order_relaxed); }

void set_threading_policy(int policy) { g_policy.store(policy, std::memory_order_relaxed); }

void set_openmp_jobs(bool on) { g_openmp.store(on ? 1 : 0, std::memory_order_relaxed); }

int threads_for(int64_t work, int64_t threshold) {
  const int policy = g_policy.load(std::memory_order_relaxed);
  if (policy == 1) return num_threads();
  if (policy == 2) return 1;
  if (threshold <= 0) return num_threads();
  int64_t t = work / threshold;
  if (t < 2) return 1;
  return static_cast<int>(std::min<int64_t>(t, num_threads()));
}

// Chunks per thread a range is cut into: enough that a thread that loses its core for a moment
// leaves its share to the others, few enough that each chunk is still one long weight stream for the
// prefetcher (a GEMV chunk of SmolLM2's smallest matrix is 4 rows x 576 int8).
// Measured on SmolLM2 wint8 decode (2 threads, quiet): 1, 2, 4 and 8 chunks per thread within noise
// of each other and of the OpenMP split; beside a busy process 4 kept 0.69x of the quiet rate where
// OpenMP regions kept 0.12x (benchmarks/bench_threads.py).
constexpr int kChunksPerThread = 4;

void parallel_ranges(int64_t n, int64_t grain, int threads, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t units = (n + grain - 1) / grain;
  const int t = static_cast<int>(std::min<int64_t>(std::max(threads, 1), units));
  if (t <= 1) {
    fn(ctx, 0, n);
    return;
  }
  const int64_t want = std::min<int64_t>(units, static_cast<int64_t>(t) * kChunksPerThread);
  const int64_t chunk = (units + want - 1) / want * grain;
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (g_openmp.load(std::memory_order_relaxed))
    openmp_run(fn, ctx, n, chunk, chunks, t);
  else
    pool_run(fn, ctx, n, chunk, chunks, t);
}

void parallel_tasks(int64_t ntasks, int threads, RangeFn fn, void* ctx) {
  if (ntasks <= 0) return;
  const int t = static_cast<int>(std::min<int64_t>(std::max(threads, 1), ntasks));
  if (g_openmp.load(std::memory_order_relaxed) && t > 1) {
    std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(t)
    {
      for (int64_t i = next.fetch_add(1); i < ntasks; i = next.fetch_add(1)) fn(ctx, i, i + 1);
    }
    return;
  }
  pool_run(fn, ctx, ntasks, 1, ntasks, t);
}

}  // namespace plk

// C entry points for Python (ctypes): thread count and a read-bandwidth probe for the benchmark.
extern "C" {
void plk_set_num_threads(int n) { plk::set_num_threads(n); }
int plk_num_threads() { return plk::num_threads(); }
int plk_cpu_has_avx2_fma() { return plk::cpu_has_avx2_fma() ? 1 : 0; }
int plk_cpu_has_avx512_vnni() { return plk::cpu_has_avx512_vnni() ? 1 : 0; }
void plk_set_threading_policy(int policy) { plk::set_threading_policy(policy); }
// 1: parallel ops run as OpenMP regions (the pre-pool form), 0: on the pool (default). Benchmarks only.
void plk_set_openmp_jobs(int on) { plk::set_openmp_jobs(on != 0); }

// Mean microseconds of an empty job of `threads` chunks on the kernels' pool (the caller's cost of
// one parallel op beyond its work), over `iters` jobs, each after `idle_us` microseconds of idling on
// the calling thread (long idles let the workers fall asleep: the cost of waking them).
static void probe_chunk(void* ctx, int64_t b, int64_t) {
  static_cast<volatile int*>(ctx)[(b & 63) * 16] += 1;
}
double plk_fork_join_probe(int iters, int threads, int idle_us) {
  static volatile int sink[64 * 16];
  double total = 0;
  for (int i = 0; i < iters; ++i) {
    double t0 = omp_get_wtime();
    while ((omp_get_wtime() - t0) * 1e6 < idle_us) {
    }
    double s = omp_get_wtime();
    plk::pool_run(probe_chunk, const_cast<int*>(sink), threads, 1, threads, threads);
    total += omp_get_wtime() - s;
  }
  return total / iters * 1e6;
}
}
