// SwiGLU activation of a fused gate_up projection (Shazeer 2020, "GLU Variants Improve Transformer"):
//   out[b, i] = silu(g) * u = (g / (1 + exp(-g))) * u,  g = gu[b, i], u = gu[b, I + i]
// (gate columns first, as the models store gate_up). The AVX2 path evaluates exp with exp256
// (vec_math.h, the attention kernel's; a gate below -88.37 gives -0 instead of a value under
// 1e-36); the generic path calls std::exp. Each path is deterministic, and the per-op call and the
// decode stack run the same function, so the two give identical bits.
#include <immintrin.h>

#include <cmath>

#include "common.h"
#include "kernels.h"
#include "vec_math.h"

namespace plk {
namespace {

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
      __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
      __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    if (i < c.I) {  // the tail through an 8-lane buffer, so every element takes the same arithmetic
      float gb[8] = {0}, ub[8] = {0}, ob[8];
      for (int64_t j = i; j < c.I; ++j) gb[j - i] = g[j], ub[j - i] = u[j];
      __m256 gv = _mm256_loadu_ps(gb);
      __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
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
