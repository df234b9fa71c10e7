// RMSNorm (Zhang & Sennrich 2019) as HF Llama computes it in fp32:
//   s = x (+ residual);  y = (s * (1 / sqrt(mean(s^2) + eps))) * w
// The residual form writes s too, so one pass replaces `h = h + delta; rms_norm(h)`.
#include <immintrin.h>

#include <cmath>

#include "common.h"
#include "kernels.h"

namespace plk {
namespace {

struct NormCtx {
  const float* x;
  const float* r;
  const float* w;
  float eps;
  float* y;
  float* s;
  int64_t H;
};

PLK_AVX2 inline __m256i mask_of(int64_t rem) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rem)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

PLK_AVX2 void rows_avx2(void* ctx, int64_t t0, int64_t t1) {
  const NormCtx& c = *static_cast<const NormCtx*>(ctx);
  const int64_t H = c.H;
  for (int64_t t = t0; t < t1; ++t) {
    const float* x = c.x + t * H;
    const float* r = c.r ? c.r + t * H : nullptr;
    float* s = c.s ? c.s + t * H : nullptr;
    float* y = c.y + t * H;
    // Pass 1: s = x + r (stored), sum of squares.
    __m256 acc = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= H; k += 8) {
      __m256 v = _mm256_loadu_ps(x + k);
      if (r) {
        v = _mm256_add_ps(v, _mm256_loadu_ps(r + k));
        _mm256_storeu_ps(s + k, v);
      }
      acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    if (k < H) {
      __m256i m = mask_of(H - k);
      __m256 v = _mm256_maskload_ps(x + k, m);
      if (r) {
        v = _mm256_add_ps(v, _mm256_maskload_ps(r + k, m));
        _mm256_maskstore_ps(s + k, m, v);
      }
      acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float inv = 1.0f / std::sqrt(hsum8_(lanes) / static_cast<float>(H) + c.eps);
    // Pass 2: y = (s * inv) * w.
    const float* src = r ? s : x;
    __m256 iv = _mm256_set1_ps(inv);
    k = 0;
    for (; k + 8 <= H; k += 8)
      _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + k), iv), _mm256_loadu_ps(c.w + k)));
    if (k < H) {
      __m256i m = mask_of(H - k);
      __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(src + k, m), iv), _mm256_maskload_ps(c.w + k, m));
      _mm256_maskstore_ps(y + k, m, v);
    }
  }
}

void rows_generic(void* ctx, int64_t t0, int64_t t1) {
  const NormCtx& c = *static_cast<const NormCtx*>(ctx);
  const int64_t H = c.H;
  for (int64_t t = t0; t < t1; ++t) {
    const float* x = c.x + t * H;
    const float* r = c.r ? c.r + t * H : nullptr;
    float* s = c.s ? c.s + t * H : nullptr;
    float* y = c.y + t * H;
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t k = 0; k < H; ++k) {
      float v = x[k];
      if (r) {
        v = v + r[k];
        s[k] = v;
      }
      lanes[k & 7] = lanes[k & 7] + v * v;
    }
    float inv = 1.0f / std::sqrt(hsum8_(lanes) / static_cast<float>(H) + c.eps);
    const float* src = r ? s : x;
    for (int64_t k = 0; k < H; ++k) y[k] = (src[k] * inv) * c.w[k];
  }
}

constexpr int64_t kNormBytesPerThread = 256 * 1024;

}  // namespace

void rms_norm(Isa isa, const float* x, const float* residual, const float* w, float eps, float* y, float* sum_out,
              int64_t T, int64_t H) {
  NormCtx c{x, residual, w, eps, y, sum_out, H};
  int threads = threads_for(T * H * 4 * (residual ? 4 : 2), kNormBytesPerThread);
  parallel_ranges(T, 1, threads, isa != Isa::kGeneric ? rows_avx2 : rows_generic, &c);
}

}  // namespace plk
