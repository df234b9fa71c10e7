// SwiGLU activation of a fused gate_up projection (Shazeer 2020, "GLU Variants Improve Transformer"):
//   out[b, i] = silu(g) * u = (g / (1 + exp(-g))) * u,  g = gu[b, i], u = gu[b, I + i]
// (gate columns first, as the models store gate_up). The AVX2 path evaluates exp with a degree-6
// polynomial after a ln2 range reduction (the Cephes expf scheme: within 2 ulp over the clamped
// range); the generic path calls std::exp. Each path is deterministic, and the per-op call and the
// decode stack run the same function, so the two give identical bits.
#include <immintrin.h>

#include <cmath>

#include "common.h"
#include "kernels.h"

namespace plk {
namespace {

// exp(x) clamped to [-87.3, 88.7] (beyond it the float result under- or overflows anyway).
PLK_AVX2 inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365447f)), _mm256_set1_ps(88.7228390f));
  // n = round(x / ln2); r = x - n * ln2, with ln2 split in two so r is exact to ~2^-32.
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n built in the exponent field; n in [-126, 128] here, and 2^128 (x near the top of the
  // clamp) is split as 2^127 * 2 so the field never overflows.
  __m256i ni = _mm256_cvtps_epi32(n);
  __m256i hi = _mm256_srai_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(1)), 1);  // ceil(n / 2)
  __m256i lo = _mm256_sub_epi32(ni, hi);
  __m256 s_hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(hi, _mm256_set1_epi32(127)), 23));
  __m256 s_lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(lo, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s_hi), s_lo);
}

struct SiluCtx {
  const float* gu;
  float* out;
  int64_t I;
};

PLK_AVX2 void rows_avx2(void* ctx, int64_t b0, int64_t b1) {
  const SiluCtx& c = *static_cast<const SiluCtx*>(ctx);
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t b = b0; b < b1; ++b) {
    const float* g = c.gu + b * 2 * c.I;
    const float* u = g + c.I;
    float* o = c.out + b * c.I;
    int64_t i = 0;
    for (; i + 8 <= c.I; i += 8) {
      __m256 gv = _mm256_loadu_ps(g + i);
      __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
      __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    if (i < c.I) {  // the tail through an 8-lane buffer, so every element takes the same arithmetic
      float gb[8] = {0}, ub[8] = {0}, ob[8];
      for (int64_t j = i; j < c.I; ++j) gb[j - i] = g[j], ub[j - i] = u[j];
      __m256 gv = _mm256_loadu_ps(gb);
      __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
      _mm256_storeu_ps(ob, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(ub)));
      for (int64_t j = i; j < c.I; ++j) o[j] = ob[j - i];
    }
  }
}

void rows_generic(void* ctx, int64_t b0, int64_t b1) {
  const SiluCtx& c = *static_cast<const SiluCtx*>(ctx);
  for (int64_t b = b0; b < b1; ++b) {
    const float* g = c.gu + b * 2 * c.I;
    const float* u = g + c.I;
    float* o = c.out + b * c.I;
    for (int64_t i = 0; i < c.I; ++i) o[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
  }
}

// Bytes of traffic per thread worth a parallel region (about 10 us of work).
constexpr int64_t kSiluBytesPerThread = 96 * 1024;

}  // namespace

void silu_mul(Isa isa, const float* gu, float* out, int64_t B, int64_t I) {
  SiluCtx c{gu, out, I};
  parallel_ranges(B, 1, threads_for(B * I * 12, kSiluBytesPerThread), isa != Isa::kGeneric ? rows_avx2 : rows_generic,
                  &c);
}

}  // namespace plk
