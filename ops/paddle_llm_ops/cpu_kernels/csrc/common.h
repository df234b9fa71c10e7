// Shared helpers of the CPU decode kernels. This header (and the kernel .cc files) include no
// Paddle header: only the op registrations (ops_*.cc) do, so the kernels compile in about a second
// each.
//
// ISA: every AVX2 function carries PLK_AVX2 (GCC's target attribute), so the shared library is
// built for plain x86-64 and runs anywhere; an AVX2 function is entered only when the caller asked
// for Isa::kAvx2Fma, and the ops refuse that request on a CPU without AVX2+FMA (parse_isa in
// ops_common.h, cpu_has_avx2_fma).
#pragma once

#include <cstddef>
#include <cstdint>

#define PLK_AVX2 __attribute__((target("avx2,fma")))

namespace plk {

// kAvx512Vnni: the int8 x int8 GEMV (gemv_w8a8_tiles.cc) runs AVX-512 VNNI code; every other op runs
// its AVX2+FMA code (kernels test `isa != Isa::kGeneric` for their AVX2 path).
enum class Isa : int { kGeneric = 0, kAvx2Fma = 1, kAvx512Vnni = 2 };

// True when the CPU and the OS (XSAVE state) support AVX2 and FMA (GCC's __builtin_cpu_supports).
bool cpu_has_avx2_fma();
// True when it also supports AVX-512 F, BW and VNNI (zmm state enabled by the OS).
bool cpu_has_avx512_vnni();

// Threads the kernels may use (>= 1): set_num_threads() if called with n >= 1, else the CPUs in
// this process's affinity mask.
int num_threads();
void set_num_threads(int n);

// Runs fn(ctx, begin, end) over [0, n) cut into chunks whose starts are multiples of `grain` (the
// last chunk takes the rest), about 4 per thread (kChunksPerThread in common.cc), taken by the caller and up to
// threads - 1 pool workers from a shared counter (thread_pool.cc). threads <= 1 or a single grain
// unit: runs on the calling thread. Every element is in exactly one chunk.
typedef void (*RangeFn)(void* ctx, int64_t begin, int64_t end);
void parallel_ranges(int64_t n, int64_t grain, int threads, RangeFn fn, void* ctx);

// Runs fn(ctx, task, task + 1) for every task in [0, ntasks), tasks handed out dynamically
// (ragged work such as attention over contexts of different lengths).
void parallel_tasks(int64_t ntasks, int threads, RangeFn fn, void* ctx);

// The pool itself: fn(ctx, i * chunk, min(n, (i + 1) * chunk)) for i < chunks on the caller and up
// to threads - 1 workers; returns when all are done (thread_pool.cc).
void pool_run(RangeFn fn, void* ctx, int64_t n, int64_t chunk, int64_t chunks, int threads);

// Threads worth using for `work` bytes of memory traffic (or comparable work): 1 below twice the
// threshold, else min(num_threads(), work / threshold). The policy (benchmarks only) overrides:
// 0 = these thresholds, 1 = always num_threads(), 2 = always 1.
int threads_for(int64_t work, int64_t threshold);
void set_threading_policy(int policy);
// Benchmarks only: run parallel ops as OpenMP regions (one contiguous range per thread, a join
// barrier) instead of on the pool, for an A/B in one process.
void set_openmp_jobs(bool on);

// Software prefetch of a weight stream. A GEMV tile reads its R weight rows in lock-step: R short
// streams (a 576-byte int8 row is 9 cache lines) that the hardware prefetchers do not run far enough
// ahead of; one core then read cold weights at about a third of the bandwidth it reaches on a plain
// sequential read. The R rows of a tile, and the tiles of a thread's range, are contiguous, so each
// step of a tile prefetches as many bytes as it consumes, a distance further along the weight: one
// linear stream. The last row of a tile is read up to a tile's size past the stream's position, so
// the distance is the tile's size plus about a DRAM miss of reading (4 KiB is 130 ns at 30 GB/s),
// and at least 6 KiB; shorter distances, or 8 rows per tile instead of 4, were up to 2x slower on one
// core (bench_kernels.py --only w8a8 reports GB/s against the host's read bandwidth). A prefetch past
// the end of the weight reads nothing and never faults.
inline int64_t prefetch_distance(int64_t tile_bytes) {
  const int64_t d = tile_bytes + 4096;
  return d < 6144 ? 6144 : d;
}

// Prefetches the cache lines of [p + dist, p + dist + BYTES) (at least one line).
template <int64_t BYTES>
inline void prefetch_ahead(const void* p, int64_t dist) {
  const char* c = static_cast<const char*>(p) + dist;
  for (int64_t i = 0; i < (BYTES < 64 ? 1 : BYTES / 64); ++i) __builtin_prefetch(c + 64 * i, 0, 3);
}

}  // namespace plk
