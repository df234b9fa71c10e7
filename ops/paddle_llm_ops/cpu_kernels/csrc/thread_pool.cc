// The kernels' thread pool: work shared in chunks through one counter, completion counted by chunks.
//
// Why not an OpenMP region per matrix: a region ends in a join barrier that every thread of the team
// must reach, so a thread that loses its core for a moment (a response's IPC, the gRPC send, a client,
// a neighbour process) stalls the caller until the scheduler gives it back its core, once per matrix.
// Measured on a 2-core host with one busy process pinned to a core: a decode-stack call on two
// OpenMP threads took 104 ms instead of 4.7 ms (about 270 regions per call, each waiting out part of
// the busy process's time slice). Here a job is split into many chunks that threads take from a
// shared counter, and the caller waits for the chunks to be done, not for the threads to arrive: a
// worker that is off its core when a job starts finds no chunk left when it wakes, and the caller
// only ever waits for a chunk a worker took and has not finished. The results do not depend on which
// thread runs a chunk (every output element is computed by one chunk, in one order).
//
// Layout of the counter: job generation in the high 40 bits, next chunk index in the low 24. A
// worker takes chunk i of generation g with a compare-and-swap from (g, i) to (g, i + 1), which fails
// once the caller has published another job, so a worker that read a job description and lost its
// core never runs a chunk of a job that is over. The two job descriptions alternate (generation
// parity): the caller writes job g + 1 only after every chunk of job g is done.
//
// Idle workers spin (with pause) for kSpinMicros, then sleep on a condition variable; the caller
// wakes sleepers when it publishes a job and never waits for them to wake. Only one caller uses the
// pool at a time; a second concurrent caller (another Python thread's op) runs its job alone.
#include <immintrin.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "common.h"

namespace plk {
namespace {

constexpr int kIndexBits = 24;
constexpr uint64_t kIndexMask = (uint64_t{1} << kIndexBits) - 1;
// How long an idle worker polls for the next job before sleeping. Jobs of one decode step follow
// each other within microseconds; between steps (Python work, responses) the workers sleep so they
// do not take a core from the serving threads.
constexpr int64_t kSpinMicros = 50;
// How long the caller polls for chunks still in flight before it starts yielding its core.
constexpr int64_t kCallerSpinMicros = 200;

inline void cpu_relax() { _mm_pause(); }

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Job {
  std::atomic<RangeFn> fn{nullptr};
  std::atomic<void*> ctx{nullptr};
  std::atomic<int64_t> n{0};
  std::atomic<int64_t> chunk{1};   // elements per chunk (the last chunk takes the rest)
  std::atomic<int64_t> chunks{0};  // number of chunks
  std::atomic<int> helpers{0};     // workers allowed to take chunks (threads - 1)
};

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true, std::memory_order_seq_cst);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  // Runs chunk i = fn(ctx, i * chunk, min(n, (i + 1) * chunk)) for every i < chunks on the caller and
  // up to `helpers` workers. Returns when every chunk is done.
  void run(RangeFn fn, void* ctx, int64_t n, int64_t chunk, int64_t chunks, int helpers) {
    std::unique_lock<std::mutex> caller(caller_mu_, std::try_to_lock);
    if (!caller.owns_lock() || chunks > static_cast<int64_t>(kIndexMask)) {
      fn(ctx, 0, n);  // another thread holds the pool (or an absurd chunk count): run alone
      return;
    }
    spawn(helpers);
    const uint64_t gen = (word_.load(std::memory_order_relaxed) >> kIndexBits) + 1;
    Job& j = jobs_[gen & 1];
    j.fn.store(fn, std::memory_order_relaxed);
    j.ctx.store(ctx, std::memory_order_relaxed);
    j.n.store(n, std::memory_order_relaxed);
    j.chunk.store(chunk, std::memory_order_relaxed);
    j.chunks.store(chunks, std::memory_order_relaxed);
    j.helpers.store(helpers, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    word_.store(gen << kIndexBits, std::memory_order_seq_cst);  // publishes the job (release)
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    }
    take_chunks(gen, fn, ctx, n, chunk, chunks);
    // Wait for chunks other threads took and have not finished.
    const int64_t t0 = now_us();
    int spins = 0;
    while (done_.load(std::memory_order_acquire) < chunks) {
      cpu_relax();
      if (++spins >= 64) {
        spins = 0;
        if (now_us() - t0 > kCallerSpinMicros) sched_yield();
      }
    }
  }

 private:
  // Takes and runs chunks of job `gen` until none is left or another job was published.
  void take_chunks(uint64_t gen, RangeFn fn, void* ctx, int64_t n, int64_t chunk, int64_t chunks) {
    uint64_t w = word_.load(std::memory_order_acquire);
    for (;;) {
      if ((w >> kIndexBits) != gen) return;
      const int64_t i = static_cast<int64_t>(w & kIndexMask);
      if (i >= chunks) return;
      if (word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        const int64_t b = i * chunk;
        const int64_t e = (i + 1 == chunks) ? n : std::min(n, b + chunk);
        if (b < e) fn(ctx, b, e);
        done_.fetch_add(1, std::memory_order_release);
        w = word_.load(std::memory_order_acquire);
      }
    }
  }

  void spawn(int helpers) {
    while (static_cast<int>(workers_.size()) < helpers) {
      const int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { work(index); });
    }
  }

  void work(int index) {
    uint64_t seen = word_.load(std::memory_order_acquire) >> kIndexBits;
    int64_t idle_since = now_us();
    int spins = 0;
    for (;;) {
      if (stop_.load(std::memory_order_relaxed)) return;
      const uint64_t w = word_.load(std::memory_order_acquire);
      const uint64_t gen = w >> kIndexBits;
      if (gen != seen) {
        seen = gen;
        const Job& j = jobs_[gen & 1];
        if (index < j.helpers.load(std::memory_order_relaxed))
          take_chunks(gen, j.fn.load(std::memory_order_relaxed), j.ctx.load(std::memory_order_relaxed),
                      j.n.load(std::memory_order_relaxed), j.chunk.load(std::memory_order_relaxed),
                      j.chunks.load(std::memory_order_relaxed));
        idle_since = now_us();
        spins = 0;
        continue;
      }
      cpu_relax();
      if (++spins < 64) continue;
      spins = 0;
      if (now_us() - idle_since < kSpinMicros) continue;
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lk, [&] {
        return stop_.load(std::memory_order_relaxed) ||
               (word_.load(std::memory_order_seq_cst) >> kIndexBits) != seen;
      });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      idle_since = now_us();
    }
  }

  std::atomic<uint64_t> word_{0};
  alignas(64) std::atomic<int64_t> done_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  Job jobs_[2];
  std::mutex caller_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
};

Pool& pool() {
  // Never destroyed: worker threads must not be joined from a static destructor at exit (the
  // interpreter may exit while a job runs on another thread).
  static Pool* p = new Pool();
  return *p;
}

}  // namespace

void pool_run(RangeFn fn, void* ctx, int64_t n, int64_t chunk, int64_t chunks, int threads) {
  if (chunks <= 1 || threads <= 1) {
    fn(ctx, 0, n);
    return;
  }
  pool().run(fn, ctx, n, chunk, chunks, threads - 1);
}

}  // namespace plk
