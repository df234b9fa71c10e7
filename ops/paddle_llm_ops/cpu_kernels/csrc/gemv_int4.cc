// Weight-only int4 GEMV (symmetric, per-group fp32 scales) for the decode batch.
//
//   y[b, n] = sum_k x[b, k] * w'[n, k]  (+ bias[n]),   w'[n, k] = fp32(q[n, k]) * scale[n, k / G]
//
// Layout: q is [N, ceil(K / 2)] bytes, two signed 4-bit values per byte (two's complement, values
// -7..7 from quantize_int4): k even in the low nibble, k + 1 in the high nibble. scale is [N, K / G]
// fp32 (G = the group size; one group = per output channel). G must be a multiple of 8 unless there
// is one group, so the 8 weights of one vector step share one scale.
//
// Arithmetic: each weight is dequantized to fp32 (one rounded product) and then summed in exactly
// the fixed order of the fp32 GEMV (gemv.cc: lanes k mod 8, a fixed lane tree; avx2_fma fuses the
// multiply-add, generic rounds the product): the output is bit-identical to gemv_f32 over the
// dequantized weight on the same isa, whatever the tiling and threads.
//
// B = 1 (decode): 8 rows per tile, each 4-byte group of 8 nibbles unpacked in registers (broadcast,
// per-lane shift left, arithmetic shift right: sign extension) and scaled; the weight stream is an
// eighth of fp32's. B > 1: 4 rows at a time are dequantized into an L1-sized fp32 buffer and the
// fp32 tiles of gemv.cc run over it (the conversion is paid once per weight, not per batch tile).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace plk {
namespace {

struct Int4Ctx {
  const float* x;
  const uint8_t* q;
  const float* scale;
  const float* bias;  // may be null
  float* y;
  int64_t B, N, K, G, groups;
};

inline int64_t row_bytes(int64_t K) { return (K + 1) / 2; }

// ---------------------------------------------------------------------------------- AVX2 + FMA
PLK_AVX2 inline __m256 dequant8_avx2(const uint8_t* p, __m256 s) {
  int32_t word;
  std::memcpy(&word, p, 4);
  const __m256i shifts = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);  // nibble j to bits 28..31
  __m256i v = _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_set1_epi32(word), shifts), 28);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(v), s);
}

PLK_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l0+l4 .. l3+l7
  __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                                   // a0+a2, a1+a3
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));                         // b0+b1
}

// R rows starting at n0, batch row 0 only; sums to out[r].
template <int R>
PLK_AVX2 void tile1_avx2(const Int4Ctx& c, int64_t n0, float* out) {
  const int64_t rb = row_bytes(c.K);
  const uint8_t* q = c.q + n0 * rb;
  const float* s = c.scale + n0 * c.groups;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= c.K; k += 8) {
    const __m256 xv = _mm256_loadu_ps(c.x + k);
    const int64_t g = c.groups == 1 ? 0 : k / c.G;
    for (int r = 0; r < R; ++r) {
      const __m256 w = dequant8_avx2(q + r * rb + k / 2, _mm256_set1_ps(s[r * c.groups + g]));
      acc[r] = _mm256_fmadd_ps(xv, w, acc[r]);
    }
  }
  if (k < c.K) {  // only with one group (G % 8 == 0 otherwise): zero nibbles and masked x past K
    const int rem = static_cast<int>(c.K - k);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 xv = _mm256_maskload_ps(c.x + k, m);
    for (int r = 0; r < R; ++r) {
      uint8_t buf[4] = {0, 0, 0, 0};
      std::memcpy(buf, q + r * rb + k / 2, (rem + 1) / 2);
      if (rem % 2) buf[rem / 2] &= 0x0F;  // the high nibble past K is padding
      acc[r] = _mm256_fmadd_ps(xv, dequant8_avx2(buf, _mm256_set1_ps(s[r * c.groups])), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_avx2(acc[r]);
}

PLK_AVX2 void dequant_rows_avx2(const Int4Ctx& c, int64_t n0, int64_t nr, float* out) {
  const int64_t rb = row_bytes(c.K);
  for (int64_t r = 0; r < nr; ++r) {
    const uint8_t* q = c.q + (n0 + r) * rb;
    const float* s = c.scale + (n0 + r) * c.groups;
    float* o = out + r * c.K;
    int64_t k = 0;
    for (; k + 8 <= c.K; k += 8)
      _mm256_storeu_ps(o + k, dequant8_avx2(q + k / 2, _mm256_set1_ps(s[c.groups == 1 ? 0 : k / c.G])));
    for (; k < c.K; ++k) {
      int v = (q[k / 2] >> (4 * (k % 2))) & 0x0F;
      o[k] = static_cast<float>(v >= 8 ? v - 16 : v) * s[c.groups == 1 ? 0 : k / c.G];
    }
  }
}

// ---------------------------------------------------------------------------------- generic
inline float nibble(const uint8_t* q, int64_t k) {
  int v = (q[k / 2] >> (4 * (k % 2))) & 0x0F;
  return static_cast<float>(v >= 8 ? v - 16 : v);
}

template <int R>
void tile1_generic(const Int4Ctx& c, int64_t n0, float* out) {
  const int64_t rb = row_bytes(c.K);
  float acc[R][8];
  std::memset(acc, 0, sizeof(acc));
  for (int r = 0; r < R; ++r) {
    const uint8_t* q = c.q + (n0 + r) * rb;
    const float* s = c.scale + (n0 + r) * c.groups;
    for (int64_t k = 0; k < c.K; k += 8) {
      const float sc = s[c.groups == 1 ? 0 : k / c.G];
      for (int j = 0; j < 8 && k + j < c.K; ++j) {
        float w = nibble(q, k + j) * sc;
        float p = c.x[k + j] * w;
        acc[r][j] = acc[r][j] + p;
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8_(acc[r]);
}

void dequant_rows_generic(const Int4Ctx& c, int64_t n0, int64_t nr, float* out) {
  const int64_t rb = row_bytes(c.K);
  for (int64_t r = 0; r < nr; ++r) {
    const uint8_t* q = c.q + (n0 + r) * rb;
    const float* s = c.scale + (n0 + r) * c.groups;
    for (int64_t k = 0; k < c.K; ++k) out[r * c.K + k] = nibble(q, k) * s[c.groups == 1 ? 0 : k / c.G];
  }
}

// ---------------------------------------------------------------------------------- driver
constexpr int kR1 = 8;       // rows per tile when B = 1
constexpr int64_t kRB = 4;   // rows dequantized per block when B > 1
constexpr int64_t kBytesPerThread = 256 * 1024;

template <bool AVX>
void emit1(const Int4Ctx& c, int64_t n0, int nr, const float* sums) {
  for (int r = 0; r < nr; ++r) {
    float v = sums[r];
    if (c.bias) v = v + c.bias[n0 + r];
    c.y[n0 + r] = v;
  }
}

template <bool AVX>
void range_b1(const Int4Ctx& c, int64_t n0, int64_t n1) {
  float sums[kR1];
  int64_t n = n0;
  for (; n + kR1 <= n1; n += kR1) {
    if (AVX) tile1_avx2<kR1>(c, n, sums); else tile1_generic<kR1>(c, n, sums);
    emit1<AVX>(c, n, kR1, sums);
  }
  for (; n < n1; ++n) {
    if (AVX) tile1_avx2<1>(c, n, sums); else tile1_generic<1>(c, n, sums);
    emit1<AVX>(c, n, 1, sums);
  }
}

template <bool AVX>
void range_batched(const Int4Ctx& c, int64_t n0, int64_t n1) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < kRB * c.K) buf.resize(kRB * c.K);
  const Isa isa = AVX ? Isa::kAvx2Fma : Isa::kGeneric;
  for (int64_t n = n0; n < n1; n += kRB) {
    const int64_t nr = n + kRB <= n1 ? kRB : n1 - n;
    if (AVX) dequant_rows_avx2(c, n, nr, buf.data()); else dequant_rows_generic(c, n, nr, buf.data());
    gemv_f32_block(isa, c.x, buf.data(), c.bias ? c.bias + n : nullptr, c.y + n, c.B, c.N, c.K, nr);
  }
}

PLK_AVX2 void range_int4_avx2(void* ctx, int64_t n0, int64_t n1) {
  const Int4Ctx& c = *static_cast<const Int4Ctx*>(ctx);
  if (c.B == 1) range_b1<true>(c, n0, n1); else range_batched<true>(c, n0, n1);
}
void range_int4_generic(void* ctx, int64_t n0, int64_t n1) {
  const Int4Ctx& c = *static_cast<const Int4Ctx*>(ctx);
  if (c.B == 1) range_b1<false>(c, n0, n1); else range_batched<false>(c, n0, n1);
}

PLK_AVX2 void dequant_range_avx2(void* ctx, int64_t n0, int64_t n1) {
  const Int4Ctx& c = *static_cast<const Int4Ctx*>(ctx);
  dequant_rows_avx2(c, n0, n1 - n0, c.y + n0 * c.K);
}
void dequant_range_generic(void* ctx, int64_t n0, int64_t n1) {
  const Int4Ctx& c = *static_cast<const Int4Ctx*>(ctx);
  dequant_rows_generic(c, n0, n1 - n0, c.y + n0 * c.K);
}

}  // namespace

void gemv_int4(Isa isa, const float* x, const uint8_t* q, const float* scale, int64_t groups, const float* bias,
               float* y, int64_t B, int64_t N, int64_t K) {
  Int4Ctx c{x, q, scale, bias, y, B, N, K, K / groups, groups};
  const int64_t work = N * row_bytes(K) + B * N * K / 2;  // weight traffic, plus compute for larger B
  parallel_ranges(N, kR1, threads_for(work, kBytesPerThread),
                  isa != Isa::kGeneric ? range_int4_avx2 : range_int4_generic, &c);
}

void dequantize_int4(Isa isa, const uint8_t* q, const float* scale, int64_t groups, float* out, int64_t N,
                     int64_t K) {
  Int4Ctx c{nullptr, q, scale, nullptr, out, 1, N, K, K / groups, groups};
  parallel_ranges(N, kR1, threads_for(N * K * 4, kBytesPerThread),
                  isa != Isa::kGeneric ? dequant_range_avx2 : dequant_range_generic, &c);
}

}  // namespace plk
