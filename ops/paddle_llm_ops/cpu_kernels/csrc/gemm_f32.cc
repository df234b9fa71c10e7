// fp32 GEMM for decode batches of 17-64 rows on AVX-512 (the avx512_vnni dispatch path), the
// layout of gemm_w8a8.cc in fp32: a panel of 32 weight rows is repacked per call as [K][32] (two
// 16 x 16 tiles transposed in registers per 16 input channels), the lanes hold 16 output channels,
// and each activation value is broadcast once per row of a 6-row tile: 12 accumulators, 2 weight
// loads and 6 broadcasts per 12 fused multiply-adds. Every weight is read once per call.
//
// Summation order (fixed, independent of tiling and threads): output (b, n) is one fp32 lane,
// acc = fma(x[b, k], W[n, k], acc) for k = 0 .. K - 1 in turn from 0, then + bias[n] (rounded).
// Intrinsics: Intel Intrinsics Guide (AVX-512 F).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace plk {
namespace {

#define PLK_AVX512 __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))

constexpr int kNR = 32;  // output channels per panel
constexpr int kMR = 6;   // activation rows per tile

struct Ctx {
  const float* x;
  const float* w;
  const float* bias;
  float* y;
  int64_t B, N, K;
};

// In-register transpose of a 16 x 16 tile: r[i] becomes column i.
PLK_AVX512 inline void transpose16_avx512(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xDD);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// p[k * 32 + j] = W[n0 + j, k] (zero past N; K rounded up to 16 with zeros).
PLK_AVX512 void pack_avx512(const Ctx& c, int64_t n0, float* p) {
  const int64_t kp = (c.K + 15) / 16 * 16;
  for (int h = 0; h < 2; ++h) {
    const int64_t r0 = n0 + 16 * h;
    for (int64_t k0 = 0; k0 < kp; k0 += 16) {
      const int64_t left = c.K - k0;
      const __mmask16 mk = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = r0 + i < c.N ? _mm512_maskz_loadu_ps(mk, c.w + (r0 + i) * c.K + k0) : _mm512_setzero_ps();
      transpose16_avx512(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(p + (k0 + i) * kNR + 16 * h, r[i]);
    }
  }
}

template <int MR>
PLK_AVX512 inline void tile_avx512(const Ctx& c, const float* p, int64_t n0, int64_t b0) {
  __m512 a[kMR][2];
  for (int m = 0; m < MR; ++m) a[m][0] = a[m][1] = _mm512_setzero_ps();
  const float* x = c.x + b0 * c.K;
  for (int64_t k = 0; k < c.K; ++k) {
    const __m512 w0 = _mm512_loadu_ps(p + k * kNR), w1 = _mm512_loadu_ps(p + k * kNR + 16);
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * c.K + k]);
      a[m][0] = _mm512_fmadd_ps(xb, w0, a[m][0]);
      a[m][1] = _mm512_fmadd_ps(xb, w1, a[m][1]);
    }
  }
  const int64_t nr = std::min<int64_t>(kNR, c.N - n0);
  for (int h = 0; h < 2; ++h) {
    const int64_t cols = std::min<int64_t>(16, nr - 16 * h);
    if (cols <= 0) break;
    const __mmask16 mk = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
    const __m512 bi = c.bias ? _mm512_maskz_loadu_ps(mk, c.bias + n0 + 16 * h) : _mm512_setzero_ps();
    for (int m = 0; m < MR; ++m) {
      const __m512 o = c.bias ? _mm512_add_ps(a[m][h], bi) : a[m][h];
      _mm512_mask_storeu_ps(c.y + (b0 + m) * c.N + n0 + 16 * h, mk, o);
    }
  }
}

PLK_AVX512 void panels_avx512(void* ctx, int64_t n0, int64_t n1) {
  const Ctx& c = *static_cast<const Ctx*>(ctx);
  thread_local std::vector<float> p;
  p.resize((c.K + 15) / 16 * 16 * kNR);
  for (int64_t n = n0; n < n1; n += kNR) {
    pack_avx512(c, n, p.data());
    int64_t b = 0;
    for (; b + kMR <= c.B; b += kMR) tile_avx512<kMR>(c, p.data(), n, b);
    switch (c.B - b) {
      case 5: tile_avx512<5>(c, p.data(), n, b); break;
      case 4: tile_avx512<4>(c, p.data(), n, b); break;
      case 3: tile_avx512<3>(c, p.data(), n, b); break;
      case 2: tile_avx512<2>(c, p.data(), n, b); break;
      case 1: tile_avx512<1>(c, p.data(), n, b); break;
      default: break;
    }
  }
}

}  // namespace

void gemm_f32_avx512(const float* x, const float* w, const float* bias, float* y, int64_t B, int64_t N, int64_t K) {
  Ctx c{x, w, bias, y, B, N, K};
  parallel_ranges(N, kNR, threads_for(N * K * 4 + B * N * K / 2, 256 * 1024), panels_avx512, &c);
}

}  // namespace plk
