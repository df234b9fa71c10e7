// Weight-streaming GEMV / skinny GEMM for the decode batch, fp32 and int8 weight-only.
//
//   y[b, n] = sum_k x[b, k] * W[n, k]                 (+ bias[n])      fp32 W [N, K]
//   y[b, n] = (sum_k x[b, k] * q[n, k]) * scale[n]    (+ bias[n])      int8 q [N, K], fp32 scale [N]
//
// W is [N, K] row-major ("out, in", the HF Linear layout and the layout of a tied embedding), so
// every output row streams one contiguous weight row. A tile of R rows x BT batch rows keeps one
// 8-lane fp32 accumulator per output; each weight vector is loaded once per tile and used BT times,
// and the R weight rows of a tile stay in L1 while all batch tiles pass over them.
//
// Summation order (fixed, the same on both ISA paths, independent of tiling and threads): output
// (b, n) has 8 lanes; lane j accumulates the terms k = j, j + 8, j + 16, ... in increasing k
// (AVX2: one fused multiply-add per term; generic: product rounded, then added); a K that is not a
// multiple of 8 behaves as if zero-padded. The lanes are then summed as
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). Tests reproduce this order exactly in numpy.
#include <immintrin.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace plk {
namespace {

// ---------------------------------------------------------------------------------- AVX2 + FMA
PLK_AVX2 inline __m256 wload(const float* p) { return _mm256_loadu_ps(p); }
PLK_AVX2 inline __m256 wload(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
PLK_AVX2 inline __m256i tail_mask(int rem) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lanes);
}
PLK_AVX2 inline __m256 wload_tail(const float* p, int rem) { return _mm256_maskload_ps(p, tail_mask(rem)); }
PLK_AVX2 inline __m256 wload_tail(const int8_t* p, int rem) {
  int8_t buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(buf, p, rem);
  return wload(buf);
}
PLK_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l0+l4 .. l3+l7
  __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                                   // a0+a2, a1+a3
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));                         // b0+b1
}

// R weight rows x BT batch rows; sums written to out[b * R + r]. pf: prefetch the weight stream
// ahead (see rows()).
template <typename WT, int R, int BT>
PLK_AVX2 inline void tile_avx2(const float* x, int64_t K, const WT* w, float* out, bool pf) {
  __m256 acc[R][BT];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < BT; ++b) acc[r][b] = _mm256_setzero_ps();
  const int64_t dist = prefetch_distance(R * K * static_cast<int64_t>(sizeof(WT)));
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    if (pf) prefetch_ahead<R * 8 * sizeof(WT)>(w + k * R, dist);  // as many bytes as this step reads
    if constexpr (BT == 1) {
      // one weight vector live at a time: R accumulators + x + a temporary fit the 16 registers
      const __m256 xv = _mm256_loadu_ps(x + k);
      for (int r = 0; r < R; ++r) acc[r][0] = _mm256_fmadd_ps(xv, wload(w + r * K + k), acc[r][0]);
    } else {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = wload(w + r * K + k);
      for (int b = 0; b < BT; ++b) {
        __m256 xv = _mm256_loadu_ps(x + b * K + k);
        for (int r = 0; r < R; ++r) acc[r][b] = _mm256_fmadd_ps(xv, wv[r], acc[r][b]);
      }
    }
  }
  if (k < K) {
    int rem = static_cast<int>(K - k);
    __m256i m = tail_mask(rem);
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = wload_tail(w + r * K + k, rem);
    for (int b = 0; b < BT; ++b) {
      __m256 xv = _mm256_maskload_ps(x + b * K + k, m);
      for (int r = 0; r < R; ++r) acc[r][b] = _mm256_fmadd_ps(xv, wv[r], acc[r][b]);
    }
  }
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) out[b * R + r] = hsum_avx2(acc[r][b]);
}

// ---------------------------------------------------------------------------------- generic
}  // namespace
float hsum8_(const float* l) {
  float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  return (a0 + a2) + (a1 + a3);
}
namespace {
inline float hsum8(const float* l) {
  float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
  float b0 = a0 + a2, b1 = a1 + a3;
  return b0 + b1;
}

template <typename WT, int R, int BT>
inline void tile_generic(const float* x, int64_t K, const WT* w, float* out) {
  float acc[R][BT][8];
  std::memset(acc, 0, sizeof(acc));
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    for (int r = 0; r < R; ++r) {
      float wv[8];
      for (int j = 0; j < 8; ++j) wv[j] = static_cast<float>(w[r * K + k + j]);
      for (int b = 0; b < BT; ++b) {
        const float* xb = x + b * K + k;
        for (int j = 0; j < 8; ++j) {
          float p = xb[j] * wv[j];
          acc[r][b][j] = acc[r][b][j] + p;
        }
      }
    }
  }
  for (int j = 0; k + j < K; ++j)
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < BT; ++b) {
        float p = x[b * K + k + j] * static_cast<float>(w[r * K + k + j]);
        acc[r][b][j] = acc[r][b][j] + p;
      }
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) out[b * R + r] = hsum8(acc[r][b]);
}

// ---------------------------------------------------------------------------------- driver
constexpr int kR = 4;   // weight rows per tile
constexpr int kR1 = 4;  // weight rows per tile when B = 1 (see range_impl)
constexpr int kBT = 3;  // batch rows per tile

struct GemvCtx {
  const float* x;
  const void* w;
  const float* scale;  // int8 only
  const float* bias;   // may be null
  float* y;
  int64_t B, N, K;
};

template <typename WT, int R, int BT, bool AVX>
inline void tile(const float* x, int64_t K, const WT* w, float* out, bool pf) {
  if (AVX)
    tile_avx2<WT, R, BT>(x, K, w, out, pf);
  else
    tile_generic<WT, R, BT>(x, K, w, out);
}

// int8 -> fp32 of n contiguous weights (exact), for the batched path below.
PLK_AVX2 void widen_avx2(const int8_t* q, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if ((i & 63) == 0) prefetch_ahead<64>(q + i, prefetch_distance(0));
    _mm256_storeu_ps(out + i, wload(q + i));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(q[i]);
}
void widen_generic(const int8_t* q, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(q[i]);
}

template <typename WT, int R, bool AVX>
inline void rows(const GemvCtx& c, int64_t n0, const WT* w, bool pf = true);

// int8 weights with more than one batch tile: widen the R rows once into an fp32 buffer (L1-sized)
// and run the fp32 tiles over it, so the conversion is paid once per weight instead of once per
// batch tile. int8 -> fp32 is exact, so the arithmetic (and its order) is unchanged.
template <int R, bool AVX>
inline bool rows_widened(const GemvCtx& c, int64_t n0) {
  if (c.B <= kBT) return false;
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < R * c.K) buf.resize(R * c.K);
  const int8_t* q = static_cast<const int8_t*>(c.w) + n0 * c.K;
  if (AVX)
    widen_avx2(q, R * c.K, buf.data());
  else
    widen_generic(q, R * c.K, buf.data());
  rows<float, R, AVX>(c, n0, buf.data(), false);
  return true;
}

// Output rows n0 .. n0 + R - 1 for every batch row; w points at weight row n0.
template <typename WT, int R, bool AVX>
inline void rows(const GemvCtx& c, int64_t n0, const WT* w, bool pf) {
  if constexpr (std::is_same<WT, int8_t>::value) {
    if (rows_widened<R, AVX>(c, n0)) return;
  }
  float sums[kBT * kR1];
  // One batch tile (B <= 3) reads the weight once: prefetch its stream. With several batch tiles
  // the loop is compute-bound and the hardware prefetcher keeps up (the stream made the int8 x int8
  // GEMV's batch-8 decode step 3-9% slower; not measured separately here).
  const bool stream = pf && c.B <= kBT;
  int64_t b = 0;
  auto emit = [&](int bt) {
    for (int i = 0; i < bt; ++i)
      for (int r = 0; r < R; ++r) {
        int64_t n = n0 + r;
        float v = sums[i * R + r];
        if (c.scale) v = v * c.scale[n];
        if (c.bias) v = v + c.bias[n];
        c.y[(b + i) * c.N + n] = v;
      }
  };
  if constexpr (R <= kR) {
    for (; b + kBT <= c.B; b += kBT) {
      tile<WT, R, kBT, AVX>(c.x + b * c.K, c.K, w, sums, stream);
      emit(kBT);
    }
    if (c.B - b == 2) {
      tile<WT, R, 2, AVX>(c.x + b * c.K, c.K, w, sums, stream);
      emit(2);
      return;
    }
  }
  if (c.B - b == 1) {  // wide tiles (R > kR) only serve B = 1
    tile<WT, R, 1, AVX>(c.x + b * c.K, c.K, w, sums, stream);
    emit(1);
  }
}

// 4 weight rows per tile; B > 1: x 3 batch rows (12 accumulators). B = 1 had 8 rows (8 read
// streams) before the weight stream was prefetched; with the prefetch, 4 rows read faster.
template <typename WT, bool AVX>
void range_impl(void* ctx, int64_t n0, int64_t n1) {
  const GemvCtx& c = *static_cast<const GemvCtx*>(ctx);
  const WT* w = static_cast<const WT*>(c.w);
  int64_t n = n0;
  if (c.B == 1)
    for (; n + kR1 <= n1; n += kR1) rows<WT, kR1, AVX>(c, n, w + n * c.K);
  for (; n + kR <= n1; n += kR) rows<WT, kR, AVX>(c, n, w + n * c.K);
  for (; n < n1; ++n) rows<WT, 1, AVX>(c, n, w + n * c.K);
}

// The AVX2 instantiations are marked with the target attribute through their own entry points.
PLK_AVX2 void range_f32_avx2(void* ctx, int64_t n0, int64_t n1) { range_impl<float, true>(ctx, n0, n1); }
PLK_AVX2 void range_i8_avx2(void* ctx, int64_t n0, int64_t n1) { range_impl<int8_t, true>(ctx, n0, n1); }
void range_f32_generic(void* ctx, int64_t n0, int64_t n1) { range_impl<float, false>(ctx, n0, n1); }
void range_i8_generic(void* ctx, int64_t n0, int64_t n1) { range_impl<int8_t, false>(ctx, n0, n1); }

// Parallel over output rows when the weight is large enough to be worth a fork/join.
constexpr int64_t kGemvBytesPerThread = 256 * 1024;

void run(const GemvCtx& c, int64_t weight_bytes, RangeFn fn) {
  int64_t work = weight_bytes + c.B * c.N * c.K / 2;  // weight traffic, plus compute for larger B
  int threads = threads_for(work, kGemvBytesPerThread);
  parallel_ranges(c.N, kR1, threads, fn, const_cast<GemvCtx*>(&c));
}

}  // namespace

void gemv_f32(Isa isa, const float* x, const float* w, const float* bias, float* y, int64_t B, int64_t N,
              int64_t K) {
  GemvCtx c{x, w, nullptr, bias, y, B, N, K};
  run(c, N * K * 4, isa != Isa::kGeneric ? range_f32_avx2 : range_f32_generic);
}

void gemv_int8(Isa isa, const float* x, const int8_t* q, const float* scale, const float* bias, float* y,
               int64_t B, int64_t N, int64_t K) {
  GemvCtx c{x, q, scale, bias, y, B, N, K};
  run(c, N * K, isa != Isa::kGeneric ? range_i8_avx2 : range_i8_generic);
}

// The fp32 tiles over nr weight rows on the calling thread: y and bias point at the block's first
// output column, ldy is y's row stride (the int4 GEMV's batched path, gemv_int4.cc).
void gemv_f32_block(Isa isa, const float* x, const float* w, const float* bias, float* y, int64_t B, int64_t ldy,
                    int64_t K, int64_t nr) {
  GemvCtx c{x, w, nullptr, bias, y, B, ldy, K};
  (isa != Isa::kGeneric ? range_f32_avx2 : range_f32_generic)(&c, 0, nr);
}

// Row-wise symmetric int8: scale[n] = max_k |w[n, k]| / 127 (fp32 division), q = round-half-even
// (w / scale) clamped to [-127, 127] (fp32 division); an all-zero row has scale 0 and q 0.
namespace {
struct QuantCtx {
  const float* w;
  int8_t* q;
  float* scale;
  int64_t K;
};
void quant_rows(void* ctx, int64_t n0, int64_t n1) {
  const QuantCtx& c = *static_cast<const QuantCtx*>(ctx);
  for (int64_t n = n0; n < n1; ++n) {
    const float* w = c.w + n * c.K;
    float m = 0.f;
    for (int64_t k = 0; k < c.K; ++k) {
      float a = w[k] < 0 ? -w[k] : w[k];
      m = a > m ? a : m;
    }
    float s = m / 127.0f;
    c.scale[n] = s;
    int8_t* q = c.q + n * c.K;
    for (int64_t k = 0; k < c.K; ++k) {
      float v = s > 0.f ? __builtin_nearbyintf(w[k] / s) : 0.f;
      v = v > 127.f ? 127.f : (v < -127.f ? -127.f : v);
      q[k] = static_cast<int8_t>(v);
    }
  }
}
}  // namespace

void quantize_int8_rows(const float* w, int8_t* q, float* scale, int64_t N, int64_t K) {
  QuantCtx c{w, q, scale, K};
  parallel_ranges(N, 16, threads_for(N * K * 5, kGemvBytesPerThread), quant_rows, &c);
}

}  // namespace plk

// ------------------------------------------------------------------------------ bandwidth probe
// Sums `bytes` bytes of fp32 data with `threads` threads (AVX2 when avx2 != 0): the benchmark times
// it to report the host's read bandwidth next to the kernels' effective GB/s.
namespace {
struct ProbeCtx {
  const float* p;
  int sink;  // keeps the sums alive
};
PLK_AVX2 void probe_avx2(void* ctx, int64_t b, int64_t e) {
  ProbeCtx& c = *static_cast<ProbeCtx*>(ctx);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = b; i + 32 <= e; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(c.p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(c.p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(c.p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(c.p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  __atomic_fetch_add(&c.sink, static_cast<int>(t), __ATOMIC_RELAXED);
}
void probe_generic(void* ctx, int64_t b, int64_t e) {
  ProbeCtx& c = *static_cast<ProbeCtx*>(ctx);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = b; i + 8 <= e; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += c.p[i + j];
  __atomic_fetch_add(&c.sink, static_cast<int>(plk::hsum8_(acc)), __ATOMIC_RELAXED);
}
}  // namespace

extern "C" int plk_read_probe(const float* p, int64_t n_floats, int threads, int avx2) {
  ProbeCtx c{p, 0};
  if (avx2 && !plk::cpu_has_avx2_fma()) avx2 = 0;
  plk::parallel_ranges(n_floats, 4096, threads, avx2 ? probe_avx2 : probe_generic, &c);
  return c.sink;
}
