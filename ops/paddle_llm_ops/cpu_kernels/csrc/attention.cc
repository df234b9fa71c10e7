// Paged decode attention: one query token per sequence over its own context, read block by block
// straight from the paged cache (no gather, no padding to the longest context).
//
//   out[b, h] = softmax_p(scale * q[b, h] . K[g, slot(b, p)]) . V[g, slot(b, p)],  p < context_lens[b]
//   g = h / (nh / kvh) (grouped-query attention), slot(b, p) = block_tables[b, p / bs] * bs + p % bs
//
// K/V may be stored as fp32, bfloat16 or fp16 (kv_dtype.h); arithmetic is fp32 throughout.
// Softmax is computed online (running max and sum, rescaled per sub-block of <= 64 positions), so
// it never overflows; the G = nh / kvh query heads of one KV head share each K/V row read.
// Work is split into tasks (sequence, KV head, chunk of blocks); long contexts are cut into several
// chunks so a small batch still spreads over the threads, and the chunks' partial (max, sum,
// weighted values) are merged exactly as the online softmax does.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_internal.h"
#include "common.h"
#include "kernels.h"
#include "vec_math.h"

namespace plk {
namespace {

constexpr int kSub = kAttnSub;  // positions per online-softmax step
constexpr int kMaxGroup = 16;   // query heads per KV head (checked in ops_attention.cc)

struct Task {
  int32_t b, g, p0, p1;  // positions [p0, p1) of sequence b, KV head g
};

struct Ctx {
  const DecodeAttnArgs* a;
  const Task* tasks;
  float* partial;  // per task: G x (d + 2): acc[d], max, sum
  int64_t G;
};

// ------------------------------------------------------------------------------------- AVX2
// [hsum(v0), ..., hsum(v7)]
PLK_AVX2 inline __m256 hsum8x8(const __m256* v) {
  __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

PLK_AVX2 inline float hmax256(__m256 v) {
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
PLK_AVX2 inline float hadd256(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

// Loaders of 8 consecutive cache values as fp32 lanes, one per cache type: the 16-bit ones widen in
// registers (exactly), so the kernel reads half the bytes and computes what it computes over fp32.
#define PLK_AVX2_F16C __attribute__((target("avx2,fma,f16c")))
struct KvF32 {
  using T = float;
  PLK_AVX2_F16C static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
};
struct KvBf16 {
  using T = uint16_t;
  PLK_AVX2_F16C static inline __m256 load8(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
};
struct KvF16 {  // F16C: entered only where the CPU has it (cpu_has_f16c)
  using T = uint16_t;
  PLK_AVX2_F16C static inline __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

// One sub-block of n <= kSub contiguous positions (rows k, v of d values of the cache type) for G heads.
template <class L>
PLK_AVX2_F16C void sub_block_avx2(const float* q, int64_t G, int64_t d, float scale, const typename L::T* k,
                                  const typename L::T* v, int n, float* acc /* G x (d + 2) */) {
  alignas(32) float s[kSub + 8];
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t h = 0; h < G; ++h) {
    const float* qh = q + h * d;
    float* st = acc + h * (d + 2);
    // scores for 8 positions at a time
    int j = 0;
    for (; j + 8 <= n; j += 8) {
      __m256 a8[8];
      for (int i = 0; i < 8; ++i) a8[i] = _mm256_setzero_ps();
      for (int64_t e = 0; e < d; e += 8) {
        __m256 qv = _mm256_loadu_ps(qh + e);
        for (int i = 0; i < 8; ++i) a8[i] = _mm256_fmadd_ps(qv, L::load8(k + (j + i) * d + e), a8[i]);
      }
      _mm256_store_ps(s + j, _mm256_mul_ps(hsum8x8(a8), vscale));
    }
    for (; j < n; ++j) {
      __m256 a1 = _mm256_setzero_ps();
      for (int64_t e = 0; e < d; e += 8) a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + e), L::load8(k + j * d + e), a1);
      s[j] = hadd256(a1) * scale;
    }
    // online softmax update
    float mb = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < n; ++i) mb = std::max(mb, s[i]);
    float m_old = st[d], m_new = std::max(m_old, mb);
    float alpha = m_old == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m_old - m_new);
    __m256 vm = _mm256_set1_ps(m_new), vsum = _mm256_setzero_ps();
    j = 0;
    for (; j + 8 <= n; j += 8) {
      __m256 p = exp256(_mm256_sub_ps(_mm256_load_ps(s + j), vm));
      _mm256_store_ps(s + j, p);
      vsum = _mm256_add_ps(vsum, p);
    }
    float psum = hadd256(vsum);
    for (; j < n; ++j) {
      s[j] = std::exp(s[j] - m_new);
      psum += s[j];
    }
    st[d] = m_new;
    st[d + 1] = st[d + 1] * alpha + psum;
    // acc = acc * alpha + sum_j p_j v_j, 64 floats (8 registers) at a time
    const __m256 va = _mm256_set1_ps(alpha);
    for (int64_t e0 = 0; e0 < d; e0 += 64) {
      const int64_t ne = std::min<int64_t>(64, d - e0) / 8;
      __m256 o[8];
      for (int64_t i = 0; i < ne; ++i) o[i] = _mm256_mul_ps(_mm256_loadu_ps(st + e0 + i * 8), va);
      for (int jj = 0; jj < n; ++jj) {
        __m256 p = _mm256_set1_ps(s[jj]);
        const typename L::T* vr = v + jj * d + e0;
        for (int64_t i = 0; i < ne; ++i) o[i] = _mm256_fmadd_ps(p, L::load8(vr + i * 8), o[i]);
      }
      for (int64_t i = 0; i < ne; ++i) _mm256_storeu_ps(st + e0 + i * 8, o[i]);
    }
  }
}

// ------------------------------------------------------------------------------------- generic
void sub_block_generic(const float* q, int64_t G, int64_t d, float scale, const float* k, const float* v, int n,
                       float* acc) {
  float s[kSub];
  for (int64_t h = 0; h < G; ++h) {
    const float* qh = q + h * d;
    float* st = acc + h * (d + 2);
    float mb = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j) {
      float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      const float* kr = k + j * d;
      for (int64_t e = 0; e < d; ++e) lanes[e & 7] = lanes[e & 7] + qh[e] * kr[e];
      s[j] = hsum8_(lanes) * scale;
      mb = std::max(mb, s[j]);
    }
    float m_old = st[d], m_new = std::max(m_old, mb);
    float alpha = m_old == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(m_old - m_new);
    float psum = 0.f;
    for (int j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - m_new);
      psum += s[j];
    }
    st[d] = m_new;
    st[d + 1] = st[d + 1] * alpha + psum;
    for (int64_t e = 0; e < d; ++e) st[e] *= alpha;
    for (int j = 0; j < n; ++j) {
      const float* vr = v + j * d;
      const float p = s[j];
      for (int64_t e = 0; e < d; ++e) st[e] += p * vr[e];
    }
  }
}

// One sub-block of n contiguous cache rows starting at element `row` (of d values each) for G query
// rows, whatever the cache type. The AVX2 kernel reads every cache type in place (KvF16 needs F16C);
// the generic kernel, and fp16 on a CPU without F16C, widen each sub-block into fp32 scratch
// (L1-sized: kSub x d) first.
struct KvReader {
  KvDtype kt;
  bool in_place;
  int64_t esize;
  KvReader(KvDtype t, bool avx, int64_t d)
      : kt(t), in_place(t == KvDtype::kF32 || (avx && (t == KvDtype::kBf16 || cpu_has_f16c()))),
        esize(kv_elem_bytes(t)) {
    if (!in_place && static_cast<int64_t>(kbuf().size()) < kSub * d) {
      kbuf().resize(kSub * d);
      vbuf().resize(kSub * d);
    }
  }
  static std::vector<float>& kbuf() {
    thread_local std::vector<float> b;
    return b;
  }
  static std::vector<float>& vbuf() {
    thread_local std::vector<float> b;
    return b;
  }
  template <bool AVX>
  void sub_block(const float* q, int64_t G, int64_t d, float scale, const void* k_cache, const void* v_cache,
                 int64_t row, int n, float* acc) const {
    const char* kp = static_cast<const char*>(k_cache) + row * esize;
    const char* vp = static_cast<const char*>(v_cache) + row * esize;
    const float *k = reinterpret_cast<const float*>(kp), *v = reinterpret_cast<const float*>(vp);
    if (!in_place) {
      kv_load(kt, kp, kbuf().data(), n * d);
      kv_load(kt, vp, vbuf().data(), n * d);
      k = kbuf().data();
      v = vbuf().data();
    }
    if constexpr (!AVX) {
      sub_block_generic(q, G, d, scale, k, v, n, acc);
    } else {
      if (in_place && kt == KvDtype::kBf16) {
        sub_block_avx2<KvBf16>(q, G, d, scale, reinterpret_cast<const uint16_t*>(kp),
                               reinterpret_cast<const uint16_t*>(vp), n, acc);
      } else if (in_place && kt == KvDtype::kF16) {
        sub_block_avx2<KvF16>(q, G, d, scale, reinterpret_cast<const uint16_t*>(kp),
                              reinterpret_cast<const uint16_t*>(vp), n, acc);
      } else {
        sub_block_avx2<KvF32>(q, G, d, scale, k, v, n, acc);
      }
    }
  }
};

// Empty online-softmax states: acc 0, max -inf, sum 0, for `rows` rows of d + 2 floats.
inline void reset_states(float* acc, int64_t rows, int64_t d) {
  for (int64_t h = 0; h < rows; ++h) {
    std::memset(acc + h * (d + 2), 0, d * sizeof(float));
    acc[h * (d + 2) + d] = -std::numeric_limits<float>::infinity();
    acc[h * (d + 2) + d + 1] = 0.f;
  }
}

template <bool AVX>
void run_tasks(void* ctx, int64_t t0, int64_t t1) {
  const Ctx& c = *static_cast<const Ctx*>(ctx);
  const DecodeAttnArgs& a = *c.a;
  const int64_t d = a.d, G = c.G, bs = a.block_size;
  for (int64_t t = t0; t < t1; ++t) {
    const Task& tk = c.tasks[t];
    float* acc = c.partial + t * G * (d + 2);
    reset_states(acc, G, d);
    const float* q = a.q + (static_cast<int64_t>(tk.b) * a.nh + tk.g * G) * d;
    const int32_t* bt = a.block_tables + static_cast<int64_t>(tk.b) * a.max_blocks;
    KvReader r(a.kv_dtype, AVX, d);
    for (int64_t p = tk.p0; p < tk.p1;) {
      const int64_t blk = bt[p / bs], off = p % bs;
      const int64_t n = std::min<int64_t>(std::min<int64_t>(bs - off, tk.p1 - p), kSub);
      const int64_t row = (static_cast<int64_t>(tk.g) * a.S + blk * bs + off) * d;
      r.sub_block<AVX>(q, G, d, a.scale, a.k_cache, a.v_cache, row, static_cast<int>(n), acc);
      p += n;
    }
  }
}

PLK_AVX2 void run_tasks_avx2(void* ctx, int64_t t0, int64_t t1) { run_tasks<true>(ctx, t0, t1); }
void run_tasks_generic(void* ctx, int64_t t0, int64_t t1) { run_tasks<false>(ctx, t0, t1); }

// Positions of K/V read per task before a context is cut into several chunks.
constexpr int64_t kChunkPositions = 512;

}  // namespace

void paged_decode_attention(Isa isa, const DecodeAttnArgs& a) {
  const int64_t G = a.nh / a.kvh, d = a.d, bs = a.block_size;
  int64_t total = 0;
  for (int64_t b = 0; b < a.B; ++b) total += a.context_lens[b];
  // Sized as fp32 whatever the cache type: a 16-bit cache reads half the bytes but does the same
  // arithmetic plus the widening, and the same thread count keeps its results equal to fp32's.
  const int64_t kv_bytes = total * a.kvh * d * 4 * 2;
  const int threads = threads_for(kv_bytes, kAttnBytesPerThread);
  // Chunk length: whole contexts when there are enough (sequence, KV head) tasks for the threads,
  // else cut long contexts into block-aligned chunks of >= kChunkPositions positions.
  int64_t chunk = std::numeric_limits<int32_t>::max();
  if (threads > 1 && a.B * a.kvh < 4 * threads) {
    int64_t want = (4 * threads + a.B * a.kvh - 1) / (a.B * a.kvh);  // chunks per context wanted
    int64_t longest = 0;
    for (int64_t b = 0; b < a.B; ++b) longest = std::max<int64_t>(longest, a.context_lens[b]);
    chunk = std::max<int64_t>(kChunkPositions, (longest + want - 1) / want);
    chunk = (chunk + bs - 1) / bs * bs;
  }
  thread_local std::vector<Task> tasks;
  thread_local std::vector<float> partial;
  thread_local std::vector<int64_t> first;  // first task of each (b, g)
  tasks.clear();
  first.assign(a.B * a.kvh + 1, 0);
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t g = 0; g < a.kvh; ++g) {
      first[b * a.kvh + g] = static_cast<int64_t>(tasks.size());
      const int64_t len = a.context_lens[b];
      for (int64_t p0 = 0; p0 < len; p0 += chunk)
        tasks.push_back({static_cast<int32_t>(b), static_cast<int32_t>(g), static_cast<int32_t>(p0),
                         static_cast<int32_t>(std::min(len, p0 + chunk))});
    }
  first[a.B * a.kvh] = static_cast<int64_t>(tasks.size());
  partial.resize(std::max<size_t>(1, tasks.size() * G * (d + 2)));
  Ctx c{&a, tasks.data(), partial.data(), G};
  const bool avx = isa != Isa::kGeneric && d % 8 == 0;
  parallel_tasks(static_cast<int64_t>(tasks.size()), threads, avx ? run_tasks_avx2 : run_tasks_generic, &c);
  // Merge the chunks of every (b, g) and normalize.
  for (int64_t bg = 0; bg < a.B * a.kvh; ++bg) {
    const int64_t b = bg / a.kvh, g = bg % a.kvh;
    const int64_t t0 = first[bg], t1 = first[bg + 1];
    for (int64_t h = 0; h < G; ++h) {
      float* out = a.out + (b * a.nh + g * G + h) * d;
      if (t1 == t0) {  // empty context
        std::memset(out, 0, d * sizeof(float));
        continue;
      }
      const float* p0 = partial.data() + (t0 * G + h) * (d + 2);
      if (t1 == t0 + 1) {
        const float inv = 1.0f / p0[d + 1];
        for (int64_t e = 0; e < d; ++e) out[e] = p0[e] * inv;
        continue;
      }
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t t = t0; t < t1; ++t) m = std::max(m, partial[(t * G + h) * (d + 2) + d]);
      float l = 0.f;
      std::memset(out, 0, d * sizeof(float));
      for (int64_t t = t0; t < t1; ++t) {
        const float* pt = partial.data() + (t * G + h) * (d + 2);
        const float w = std::exp(pt[d] - m);
        l += pt[d + 1] * w;
        for (int64_t e = 0; e < d; ++e) out[e] += pt[e] * w;
      }
      const float inv = 1.0f / l;
      for (int64_t e = 0; e < d; ++e) out[e] *= inv;
    }
  }
}

void attn_reset_states(float* acc, int64_t rows, int64_t d) { reset_states(acc, rows, d); }

void attn_sub_block(bool avx, KvDtype kt, const float* q, int64_t rows, int64_t d, float scale, const void* k_cache,
                    const void* v_cache, int64_t row, int n, float* acc) {
  const KvReader r(kt, avx, d);
  if (avx)
    r.sub_block<true>(q, rows, d, scale, k_cache, v_cache, row, n, acc);
  else
    r.sub_block<false>(q, rows, d, scale, k_cache, v_cache, row, n, acc);
}

}  // namespace plk
