// Paged prefill attention: the causal attention of one sequence's chunk of new tokens over its whole
// context, read straight from the cache by slot (kernels.h PrefillAttnArgs), on the online-softmax
// sub-blocks of attention.cc. Replaces the composed path's gathered K/V, score matrix, mask and
// softmax (at 2,000 tokens it took 2.3x this kernel's time).
#include <algorithm>
#include <cstring>
#include <vector>

#include "attention_internal.h"
#include "common.h"
#include "kernels.h"

namespace plk {
namespace {

// Tasks of (KV head, block of kQueryBlock queries): the block's G * kQueryBlock query rows share
// every K/V sub-block read (from L1), as the G heads of one decode query do. Keys every query of the
// block sees (p <= start_pos + first query) run for all rows at once; the few past that (inside the
// block's causal triangle) run query by query, each up to its own position. Online softmax as in
// decode; work grows with the block's position, so tasks are handed out dynamically.
constexpr int64_t kQueryBlock = 16;

struct PrefillCtx {
  const PrefillAttnArgs* a;
  int64_t G, blocks;
};

// Positions [p, end) read as runs of contiguous slots of at most kAttnSub: calls f(row, n) per run.
template <class F>
inline void slot_runs(const PrefillAttnArgs& a, int64_t g, int64_t p, int64_t end, F&& f) {
  while (p < end) {
    int64_t n = 1;
    while (p + n < end && n < kAttnSub && a.slots[p + n] == a.slots[p] + n) ++n;
    f((g * a.S + a.slots[p]) * a.d, static_cast<int>(n));
    p += n;
  }
}

template <bool AVX>
void run_prefill(void* ctx, int64_t t0, int64_t t1) {
  const PrefillCtx& c = *static_cast<const PrefillCtx*>(ctx);
  const PrefillAttnArgs& a = *c.a;
  const int64_t d = a.d, G = c.G;
  thread_local std::vector<float> qb, acc;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t g = t / c.blocks, i0 = (t % c.blocks) * kQueryBlock, i1 = std::min(a.n, i0 + kQueryBlock);
    const int64_t rows = (i1 - i0) * G;
    qb.resize(rows * d);
    acc.resize(rows * (d + 2));
    for (int64_t i = i0; i < i1; ++i)  // rows (i, head) of this KV head, contiguous
      std::memcpy(qb.data() + (i - i0) * G * d, a.q + (i * a.nh + g * G) * d, G * d * sizeof(float));
    attn_reset_states(acc.data(), rows, d);
    const int64_t shared = a.start_pos + i0 + 1;  // keys 0 .. start_pos + i0: every row sees them
    slot_runs(a, g, 0, shared, [&](int64_t row, int n) {
      attn_sub_block(AVX, a.kv_dtype, qb.data(), rows, d, a.scale, a.k_cache, a.v_cache, row, n, acc.data());
    });
    for (int64_t i = i0 + 1; i < i1; ++i)  // query i also sees start_pos + i0 + 1 .. start_pos + i
      slot_runs(a, g, shared, a.start_pos + i + 1, [&](int64_t row, int n) {
        attn_sub_block(AVX, a.kv_dtype, qb.data() + (i - i0) * G * d, G, d, a.scale, a.k_cache, a.v_cache, row, n,
                       acc.data() + (i - i0) * G * (d + 2));
      });
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t h = 0; h < G; ++h) {
        const float* st = acc.data() + ((i - i0) * G + h) * (d + 2);
        float* out = a.out + (i * a.nh + g * G + h) * d;
        const float inv = 1.0f / st[d + 1];
        for (int64_t e = 0; e < d; ++e) out[e] = st[e] * inv;
      }
  }
}

void run_prefill_avx2(void* ctx, int64_t t0, int64_t t1) { run_prefill<true>(ctx, t0, t1); }
void run_prefill_generic(void* ctx, int64_t t0, int64_t t1) { run_prefill<false>(ctx, t0, t1); }

}  // namespace

void paged_prefill_attention(Isa isa, const PrefillAttnArgs& a) {
  if (a.n <= 0) return;
  const int64_t G = a.nh / a.kvh, blocks = (a.n + kQueryBlock - 1) / kQueryBlock;
  // Work ~ keys read per query row: n * (start_pos + n / 2) * kvh * d; threads as decode sizes them.
  const int64_t work = a.n * (a.start_pos + a.n / 2 + 1) * a.kvh * a.d * 4 * 2 / kQueryBlock;
  PrefillCtx c{&a, G, blocks};
  const bool avx = isa != Isa::kGeneric && a.d % 8 == 0;
  parallel_tasks(a.kvh * blocks, threads_for(work, kAttnBytesPerThread), avx ? run_prefill_avx2 : run_prefill_generic,
                 &c);
}

}  // namespace plk
