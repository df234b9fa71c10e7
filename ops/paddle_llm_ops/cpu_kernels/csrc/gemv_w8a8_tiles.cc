// Tile kernels of the int8 x int8 GEMV / skinny GEMM (its scheme, the activation quantization and
// the entry points are in gemv_w8a8.cc): the exact integer group sums of R weight rows x BT batch
// rows on each isa, the fp32 lane paths for groups of 32, and the threaded driver over the output
// rows. Kept apart as the isa-specific half of the op.
//
// Paths:
// - AVX-512 VNNI: vpdpbusd (_mm512_dpbusd_epi32) multiplies unsigned bytes by signed bytes and adds
//   groups of 4 products into int32 lanes. The activations are offset to unsigned (xq + 128, in
//   [1, 255]) and the offset is removed per group with the weight row's sum, itself computed by a
//   second vpdpbusd against a vector of ones: sum (xq + 128) q = sum xq q + 128 sum q.
//   Lane bound: 255 * 127 * 4 per instruction, so int32 is exact for groups up to 65536 weights.
// - AVX2: vpmaddubsw (_mm256_maddubs_epi16) also takes unsigned x signed bytes, but sums pairs into
//   int16 with saturation: (xq + 128) * q pairs reach 64770 and would saturate. llama.cpp's
//   mul_sum_i8_pairs instead feeds |q| (unsigned) and xq * sign(q) (signed, vpsignb): each pair is
//   at most 2 * 127 * 127 = 32258 < 32767, never saturated, and |q| * xq sign(q) = xq q exactly
//   (q is never -128: the quantizer clamps to [-127, 127]). vpmaddwd against ones widens to int32.
// - generic: plain C++ int32 loops (the reference semantics).
// Intrinsics: Intel Intrinsics Guide (vpdpbusd, vpmaddubsw, vpmaddwd, vpsignb).
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common.h"
#include "gemv_w8a8.h"

namespace plk {
namespace {

// ------------------------------------------------------------------------------- AVX-512 VNNI
#define PLK_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))

// Integer sums of group [k0, k1) for R weight rows x BT batch rows: out[b * R + r].
template <int R, int BT>
PLK_VNNI inline void group_vnni(const W8A8Ctx& c, const uint8_t* xu, const int8_t* w, int64_t k0, int64_t k1,
                                int32_t* out) {
  __m512i acc[R][BT], wsum[R];
  const __m512i ones = _mm512_set1_epi8(1);
  for (int r = 0; r < R; ++r) {
    wsum[r] = _mm512_setzero_si512();
    for (int b = 0; b < BT; ++b) acc[r][b] = _mm512_setzero_si512();
  }
  for (int64_t k = k0; k < k1; k += 64) {
    const int64_t rem = k1 - k;
    const __mmask64 m = rem >= 64 ? ~__mmask64(0) : ((__mmask64(1) << rem) - 1);
    __m512i wv[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = _mm512_maskz_loadu_epi8(m, w + r * c.K + k);  // masked: never reads past the row
      wsum[r] = _mm512_dpbusd_epi32(wsum[r], ones, wv[r]);
    }
    for (int b = 0; b < BT; ++b) {
      const __m512i xv = _mm512_loadu_si512(xu + b * c.Kp + k);  // padded buffer: always 64 bytes
      for (int r = 0; r < R; ++r) acc[r][b] = _mm512_dpbusd_epi32(acc[r][b], xv, wv[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int32_t off = 128 * _mm512_reduce_add_epi32(wsum[r]);
    for (int b = 0; b < BT; ++b) out[b * R + r] = _mm512_reduce_add_epi32(acc[r][b]) - off;
  }
}

// ------------------------------------------------------------------------------------ AVX2
template <int R, int BT>
PLK_AVX2 inline void group_avx2(const W8A8Ctx& c, const int8_t* xq, const int8_t* w, int64_t k0, int64_t k1,
                                int32_t* out) {
  __m256i acc[R][BT];
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < BT; ++b) acc[r][b] = _mm256_setzero_si256();
  for (int64_t k = k0; k < k1; k += 32) {
    const int64_t rem = k1 - k;
    __m256i aw[R], wv[R];
    for (int r = 0; r < R; ++r) {
      if (rem >= 32) {
        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * c.K + k));
      } else {  // tail of a row: copy so that nothing past the row is read; zeros contribute 0
        alignas(32) int8_t buf[32] = {0};
        std::memcpy(buf, w + r * c.K + k, static_cast<size_t>(rem));
        wv[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
      }
      aw[r] = _mm256_sign_epi8(wv[r], wv[r]);  // |q|
    }
    for (int b = 0; b < BT; ++b) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * c.Kp + k));
      for (int r = 0; r < R; ++r) {
        const __m256i sx = _mm256_sign_epi8(xv, wv[r]);          // xq * sign(q)
        const __m256i p16 = _mm256_maddubs_epi16(aw[r], sx);     // pairs, |.| <= 32258
        acc[r][b] = _mm256_add_epi32(acc[r][b], _mm256_madd_epi16(p16, ones16));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < BT; ++b) {
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc[r][b]), _mm256_extracti128_si256(acc[r][b], 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
      out[b * R + r] = _mm_cvtsi128_si32(s);
    }
}

// ------------------------------------------------------------- lane paths for groups of 32
// With one activation scale per 32 input channels, reducing every group's integer sum to a scalar
// (the exact path above) costs more than the dot products. As llama.cpp's Q8_0 x Q8_0 loops do,
// these keep each int32 lane (4 k on VNNI, 4 k after vpmaddwd on AVX2: |lane| <= 4 * 127 * 127,
// exact in fp32), convert it and multiply-add it with its group's activation scale into fp32
// lanes, reduced once per output at the end. The integer products are the exact ones; only the
// fp32 summation order differs from the exact path (within fp32 rounding, tested).
template <int R, int BT>
PLK_VNNI inline void lanes_vnni(const W8A8Ctx& c, int64_t b0, const int8_t* w, float* out) {
  __m512 acc[R][BT];
  const __m512i ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < BT; ++b) acc[r][b] = _mm512_setzero_ps();
  const uint8_t* xu = c.xu + b0 * c.Kp;
  const float* xsl = c.xsl + b0 * (c.Kp / 4);
  // One pass over the tile (B <= 3): the weight stream, as much as each step reads, well ahead.
  // Several passes (compute-bound): the next tile's rows, a line per row per step on every pass,
  // measured faster there than the stream.
  const bool stream = c.B <= 3;
  const int64_t dist = prefetch_distance(R * c.K);
  for (int64_t k = 0; k < c.K; k += 64) {
    const int64_t rem = c.K - k;
    const __mmask64 m = rem >= 64 ? ~__mmask64(0) : ((__mmask64(1) << rem) - 1);
    __m512i wv[R], off[R];
    if (stream) prefetch_ahead<R * 64>(w + k * R, dist);
    for (int r = 0; r < R; ++r) {
      if (!stream) __builtin_prefetch(w + (R + r) * c.K + k, 0, 3);
      wv[r] = _mm512_maskz_loadu_epi8(m, w + r * c.K + k);
      // -128 * (sum of the lane's 4 weights): starts each lane's dot product at the offset's cost.
      // (Flipping the weights to unsigned instead, with the offset from the activations' lane sums
      // computed once per call, saves two operations per weight vector but ran no faster.)
      off[r] = _mm512_sub_epi32(zero, _mm512_slli_epi32(_mm512_dpbusd_epi32(zero, ones, wv[r]), 7));
    }
    for (int b = 0; b < BT; ++b) {
      const __m512i xv = _mm512_loadu_si512(xu + b * c.Kp + k);
      const __m512 sv = _mm512_loadu_ps(xsl + b * (c.Kp / 4) + k / 4);
      for (int r = 0; r < R; ++r)
        acc[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(off[r], xv, wv[r])), sv, acc[r][b]);
    }
  }
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) out[b * R + r] = _mm512_reduce_add_ps(acc[r][b]);
}

template <int R, int BT>
PLK_AVX2 inline void lanes_avx2(const W8A8Ctx& c, int64_t b0, const int8_t* w, float* out) {
  __m256 acc[R][BT];
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < BT; ++b) acc[r][b] = _mm256_setzero_ps();
  const int8_t* xq = c.xq + b0 * c.Kp;
  const bool stream = c.B <= 3;  // as in lanes_vnni
  const int64_t dist = prefetch_distance(R * c.K);
  for (int64_t k = 0; k < c.K; k += 32) {
    const int64_t rem = c.K - k;
    __m256i wv[R];
    if (stream) prefetch_ahead<R * 32>(w + k * R, dist);
    for (int r = 0; r < R; ++r) {
      if (!stream && (k & 63) == 0) __builtin_prefetch(w + (R + r) * c.K + k, 0, 3);
      if (rem >= 32) {
        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * c.K + k));
      } else {
        alignas(32) int8_t buf[32] = {0};
        std::memcpy(buf, w + r * c.K + k, static_cast<size_t>(rem));
        wv[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
      }
    }
    for (int b = 0; b < BT; ++b) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * c.Kp + k));
      const __m256 sv = _mm256_set1_ps(c.xs[(b0 + b) * c.groups + k / 32]);
      for (int r = 0; r < R; ++r) {
        const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv[r], wv[r]), _mm256_sign_epi8(xv, wv[r]));
        acc[r][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones16)), sv, acc[r][b]);
      }
    }
  }
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) {
      __m128 a = _mm_add_ps(_mm256_castps256_ps128(acc[r][b]), _mm256_extractf128_ps(acc[r][b], 1));
      __m128 h = _mm_add_ps(a, _mm_movehl_ps(a, a));
      out[b * R + r] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    }
}

template <int R, int BT, Isa I>
inline void lane_tile(const W8A8Ctx& c, int64_t n0, int64_t b0) {
  float v[R * BT];
  if constexpr (I == Isa::kAvx512Vnni)
    lanes_vnni<R, BT>(c, b0, c.q + n0 * c.K, v);
  else
    lanes_avx2<R, BT>(c, b0, c.q + n0 * c.K, v);
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) {
      const int64_t n = n0 + r;
      float o = v[b * R + r] * c.scale[n];
      if (c.bias) o = o + c.bias[n];
      c.y[(b0 + b) * c.N + n] = o;
    }
}

// Register budget: VNNI (32 zmm) takes 4 rows x 3 batch rows; AVX2 (16 ymm) 4 x 1 or 2 x 3
// (accumulators + weights).
template <Isa I>
inline void lane_range(void* ctx, int64_t n0, int64_t n1) {
  const W8A8Ctx& c = *static_cast<const W8A8Ctx*>(ctx);
  constexpr bool V = I == Isa::kAvx512Vnni;
  // B = 1: 4 rows (with the prefetched stream, 8 rows ran 10-30% slower than 4 on the VNNI path)
  constexpr int R1 = 4, RB = V ? 4 : 2;
  int64_t n = n0;
  if (c.B == 1) {
    for (; n + R1 <= n1; n += R1) lane_tile<R1, 1, I>(c, n, 0);
    for (; n < n1; ++n) lane_tile<1, 1, I>(c, n, 0);
    return;
  }
  auto rows = [&](auto rt, int64_t nn) {
    constexpr int R = decltype(rt)::value;
    int64_t b = 0;
    for (; b + 3 <= c.B; b += 3) lane_tile<R, 3, I>(c, nn, b);
    if (c.B - b == 2) lane_tile<R, 2, I>(c, nn, b);
    if (c.B - b == 1) lane_tile<R, 1, I>(c, nn, b);
  };
  for (; n + RB <= n1; n += RB) rows(std::integral_constant<int, RB>{}, n);
  for (; n < n1; ++n) rows(std::integral_constant<int, 1>{}, n);
}

// ---------------------------------------------------------------------------------- generic
template <int R, int BT>
inline void group_generic(const W8A8Ctx& c, const int8_t* xq, const int8_t* w, int64_t k0, int64_t k1,
                          int32_t* out) {
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) {
      const int8_t* wr = w + r * c.K;
      const int8_t* xb = xq + b * c.Kp;
      int32_t s = 0;
      for (int64_t k = k0; k < k1; ++k) s += static_cast<int32_t>(xb[k]) * static_cast<int32_t>(wr[k]);
      out[b * R + r] = s;
    }
}

// ---------------------------------------------------------------------------------- driver
constexpr int kR = 4;   // weight rows per tile
constexpr int kR1 = 8;  // weight rows per tile when B = 1
constexpr int kBT = 3;  // batch rows per tile

template <int R, int BT, Isa I>
inline void group_sums(const W8A8Ctx& c, int64_t b0, const int8_t* w, int64_t k0, int64_t k1, int32_t* out) {
  if constexpr (I == Isa::kAvx512Vnni)
    group_vnni<R, BT>(c, c.xu + b0 * c.Kp, w, k0, k1, out);
  else if constexpr (I == Isa::kAvx2Fma)
    group_avx2<R, BT>(c, c.xq + b0 * c.Kp, w, k0, k1, out);
  else
    group_generic<R, BT>(c, c.xq + b0 * c.Kp, w, k0, k1, out);
}

// Output rows n0 .. n0 + R - 1 of batch rows b0 .. b0 + BT - 1, every group in turn.
template <int R, int BT, Isa I>
inline void tile(const W8A8Ctx& c, int64_t n0, int64_t b0) {
  const int8_t* w = c.q + n0 * c.K;
  float v[BT * R];
  for (int i = 0; i < BT * R; ++i) v[i] = 0.f;
  int32_t s[BT * R];
  for (int64_t g = 0; g < c.groups; ++g) {
    const int64_t k0 = g * c.G, k1 = k0 + c.G < c.K ? k0 + c.G : c.K;
    group_sums<R, BT, I>(c, b0, w, k0, k1, s);
    for (int b = 0; b < BT; ++b)
      for (int r = 0; r < R; ++r) {
        if (c.acc_out) {
          c.acc_out[((b0 + b) * c.N + n0 + r) * c.groups + g] = s[b * R + r];
        } else {
          float p = c.xs[(b0 + b) * c.groups + g] * static_cast<float>(s[b * R + r]);
          v[b * R + r] = v[b * R + r] + p;
        }
      }
  }
  if (c.acc_out) return;
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) {
      const int64_t n = n0 + r;
      float out = v[b * R + r] * c.scale[n];
      if (c.bias) out = out + c.bias[n];
      c.y[(b0 + b) * c.N + n] = out;
    }
}

template <int R, Isa I>
inline void rows(const W8A8Ctx& c, int64_t n0) {
  int64_t b = 0;
  if constexpr (R <= kR) {
    for (; b + kBT <= c.B; b += kBT) tile<R, kBT, I>(c, n0, b);
    if (c.B - b == 2) {
      tile<R, 2, I>(c, n0, b);
      return;
    }
  }
  if (c.B - b == 1) tile<R, 1, I>(c, n0, b);  // wide tiles (R > kR) only serve B = 1
}

template <Isa I>
inline void range_impl(void* ctx, int64_t n0, int64_t n1) {
  const W8A8Ctx& c = *static_cast<const W8A8Ctx*>(ctx);
  int64_t n = n0;
  if (c.B == 1)
    for (; n + kR1 <= n1; n += kR1) rows<kR1, I>(c, n);
  for (; n + kR <= n1; n += kR) rows<kR, I>(c, n);
  for (; n < n1; ++n) rows<1, I>(c, n);
}

PLK_VNNI void range_vnni(void* ctx, int64_t n0, int64_t n1) { range_impl<Isa::kAvx512Vnni>(ctx, n0, n1); }
PLK_AVX2 void range_avx2(void* ctx, int64_t n0, int64_t n1) { range_impl<Isa::kAvx2Fma>(ctx, n0, n1); }
PLK_VNNI void lanes_range_vnni(void* ctx, int64_t n0, int64_t n1) { lane_range<Isa::kAvx512Vnni>(ctx, n0, n1); }
PLK_AVX2 void lanes_range_avx2(void* ctx, int64_t n0, int64_t n1) { lane_range<Isa::kAvx2Fma>(ctx, n0, n1); }
void range_generic(void* ctx, int64_t n0, int64_t n1) { range_impl<Isa::kGeneric>(ctx, n0, n1); }

constexpr int64_t kBytesPerThread = 256 * 1024;

// The lane paths serve groups of 32 on the vector isas (float output only).
bool use_lanes(Isa isa, const W8A8Ctx& c) { return isa != Isa::kGeneric && c.G == 32 && c.acc_out == nullptr; }

}  // namespace

void w8a8_run(Isa isa, W8A8Ctx& c) {
  if (w8a8_gemm_applies(isa, c)) return w8a8_gemm_run(c);
  const int64_t work = c.N * c.K + c.B * c.N * c.K / 8;  // weight bytes, plus compute for larger B
  RangeFn fn = isa == Isa::kAvx512Vnni ? range_vnni : (isa == Isa::kAvx2Fma ? range_avx2 : range_generic);
  if (use_lanes(isa, c)) fn = isa == Isa::kAvx512Vnni ? lanes_range_vnni : lanes_range_avx2;
  parallel_ranges(c.N, kR1, threads_for(work, kBytesPerThread), fn, &c);
}

}  // namespace plk
