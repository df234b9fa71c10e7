#include "common.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>

namespace plk {

namespace {
std::atomic<int> g_threads{0};
std::atomic<int> g_policy{0};

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

int threads_for(int64_t work, int64_t threshold) {
  const int policy = g_policy.load(std::memory_order_relaxed);
  if (policy == 1) return num_threads();
  if (policy == 2) return 1;
  if (threshold <= 0) return num_threads();
  int64_t t = work / threshold;
  if (t < 2) return 1;
  return static_cast<int>(std::min<int64_t>(t, num_threads()));
}

void parallel_ranges(int64_t n, int64_t grain, int threads, RangeFn fn, void* ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t units = (n + grain - 1) / grain;
  int t = static_cast<int>(std::min<int64_t>(std::max(threads, 1), units));
  if (t <= 1) {
    fn(ctx, 0, n);
    return;
  }
#pragma omp parallel num_threads(t)
  {
    int id = omp_get_thread_num();
    int nt = omp_get_num_threads();
    int64_t u0 = units * id / nt, u1 = units * (id + 1) / nt;
    int64_t b = u0 * grain, e = std::min(n, u1 * grain);
    if (b < e) fn(ctx, b, e);
  }
}

void parallel_tasks(int64_t ntasks, int threads, RangeFn fn, void* ctx) {
  if (ntasks <= 0) return;
  int t = static_cast<int>(std::min<int64_t>(std::max(threads, 1), ntasks));
  if (t <= 1) {
    fn(ctx, 0, ntasks);
    return;
  }
  // A shared counter hands out the tasks (a plain parallel region: no OpenMP loop-scheduling
  // entry points, which differ between libgomp and libiomp5's GOMP_* layer).
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(t)
  {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < ntasks;
         i = next.fetch_add(1, std::memory_order_relaxed))
      fn(ctx, i, i + 1);
  }
}

}  // namespace plk

// C entry points for Python (ctypes): thread count and a read-bandwidth probe for the benchmark.
extern "C" {
void plk_set_num_threads(int n) { plk::set_num_threads(n); }
int plk_num_threads() { return plk::num_threads(); }
int plk_cpu_has_avx2_fma() { return plk::cpu_has_avx2_fma() ? 1 : 0; }
int plk_cpu_has_avx512_vnni() { return plk::cpu_has_avx512_vnni() ? 1 : 0; }
void plk_set_threading_policy(int policy) { plk::set_threading_policy(policy); }

// Mean microseconds of an empty OpenMP region of `threads` threads on the runtime the kernels use,
// over `iters` regions, each after `idle_us` microseconds of idling on the calling thread.
double plk_fork_join_probe(int iters, int threads, int idle_us) {
  static volatile int sink[64 * 16];
  double total = 0;
  for (int i = 0; i < iters; ++i) {
    double t0 = omp_get_wtime();
    while ((omp_get_wtime() - t0) * 1e6 < idle_us) {
    }
    double s = omp_get_wtime();
#pragma omp parallel num_threads(threads)
    { sink[(omp_get_thread_num() & 63) * 16] += 1; }
    total += omp_get_wtime() - s;
  }
  return total / iters * 1e6;
}
}
