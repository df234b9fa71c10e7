// int4 weights x int8 activations (wint4 on AVX-512 VNNI): llama.cpp's Q4 x Q8 scheme with wint4's
// symmetric nibbles and per-group fp32 weight scales.
//
//   xs[b, j]  = max_{k in block j} |x[b, k]| / 127, blocks of 32 input channels   (as gemv_w8a8)
//   xq[b, k]  = clamp(round-half-even(x[b, k] / xs[b, j]), -127, 127)
//   y[b, n]   = sum over lanes l of float(acc[b, n, l]) * xs[b, block(l)] * ws[n, group(l)] (+ bias)
//   acc[b, n, l] = sum_{k in lane l} xq[b, k] * q[n, k]   (exact int32; a lane = 8 consecutive k)
//
// Why: the weight-only int4 GEMV (gemv_int4.cc) widens every nibble to fp32 and multiplies in fp32,
// compute-bound at about half the rate llama.cpp's Q4_1 server decodes at on the same host; here the
// nibbles meet int8 activations in vpdpbusd, 4 products per byte lane per instruction.
//
// Layout (gemv_int4.cc's): q [N, K / 2] bytes, k even in the low nibble, k + 1 in the high one,
// two's complement in [-7, 7]; ws [N, K / G]. One vector step reads 64 bytes of a row = 128 k: the
// low nibbles are the even k, the high ones the odd k, so the activations are split once per call
// into xe (even k) and xo (odd k) rows, offset to unsigned (xq + 128, vpdpbusd's unsigned operand)
// and the offset removed per lane with the weights' lane sums (a vpdpbusd against ones), as in
// gemv_w8a8_tiles.cc. Byte lane i of a step holds k in [128 s + 8 i, 128 s + 8 i + 8): one activation
// block (32 = 4 lanes) and one weight group (G a multiple of 32) per lane. Requirements (checked by
// the op): K a multiple of 32, G a multiple of 32. The fp32 order (lanes of 16, reduced at the end)
// is fixed by the tiling; the tests bound it against an exact float64 reference.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "common.h"
#include "gemv_w8a8.h"
#include "kernels.h"

namespace plk {
namespace {

#define PLK_VNNI4 __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))

struct W4A8Ctx {
  const uint8_t* xe;   // [B, Hp] xq of even k + 128, by byte lane of q (Hp: padded K / 2)
  const uint8_t* xo;   // [B, Hp] odd k
  const float* xsl;    // [B, Hp / 4]: the activation scale of each 32-bit lane (0 past K)
  const uint8_t* q;    // [N, K / 2]
  const float* ws;     // [N, groups]
  const int32_t* gidx;  // [steps, 16]: the weight group of each lane of a step, relative to gbase
  const int64_t* gbase;  // [steps]
  const float* bias;
  float* y;
  int64_t B, N, K, H, Hp, G, groups, steps;
};

// R weight rows x BT batch rows, every step of the row; out[b * R + r].
template <int R, int BT>
PLK_VNNI4 inline void tile_vnni(const W4A8Ctx& c, int64_t n0, int64_t b0, float* out) {
  __m512 acc[R][BT];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < BT; ++b) acc[r][b] = _mm512_setzero_ps();
  const __m512i ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
  const __m512i low4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  const uint8_t* w = c.q + n0 * c.H;
  const bool stream = c.B <= 3;
  const int64_t dist = prefetch_distance(R * c.H);
  for (int64_t s = 0; s < c.steps; ++s) {
    const int64_t j = s * 64, rem = c.H - j;
    const __mmask64 m = rem >= 64 ? ~__mmask64(0) : ((__mmask64(1) << rem) - 1);
    const int64_t g0 = c.gbase[s];
    const __mmask16 gm = static_cast<__mmask16>((1u << (c.groups - g0 < 4 ? c.groups - g0 : 4)) - 1);
    const __m512i gi = _mm512_loadu_si512(c.gidx + 16 * s);
    if (stream) prefetch_ahead<R * 64>(w + j * R, dist);
    __m512i lo[R], hi[R], off[R];
    __m512 wsv[R];
    for (int r = 0; r < R; ++r) {
      const __m512i v = _mm512_maskz_loadu_epi8(m, w + r * c.H + j);
      // nibble -> signed byte: (n ^ 8) - 8 maps 0..7 to 0..7 and 9..15 to -7..-1
      lo[r] = _mm512_sub_epi8(_mm512_xor_si512(_mm512_and_si512(v, low4), eight), eight);
      hi[r] = _mm512_sub_epi8(_mm512_xor_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), eight), eight);
      // masked-off bytes are 0 -> (0 ^ 8) - 8 = 0: past the row nothing is added
      const __m512i sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, ones, lo[r]), ones, hi[r]);
      off[r] = _mm512_sub_epi32(zero, _mm512_slli_epi32(sums, 7));
      wsv[r] = _mm512_permutexvar_ps(gi, _mm512_maskz_loadu_ps(gm, c.ws + (n0 + r) * c.groups + g0));
    }
    for (int b = 0; b < BT; ++b) {
      const __m512i xe = _mm512_loadu_si512(c.xe + (b0 + b) * c.Hp + j);
      const __m512i xo = _mm512_loadu_si512(c.xo + (b0 + b) * c.Hp + j);
      const __m512 xs = _mm512_loadu_ps(c.xsl + (b0 + b) * (c.Hp / 4) + j / 4);
      for (int r = 0; r < R; ++r) {
        const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(off[r], xe, lo[r]), xo, hi[r]);
        acc[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(xs, wsv[r]), acc[r][b]);
      }
    }
  }
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) out[b * R + r] = _mm512_reduce_add_ps(acc[r][b]);
}

template <int R, int BT>
PLK_VNNI4 inline void emit_vnni(const W4A8Ctx& c, int64_t n0, int64_t b0) {
  float v[R * BT];
  tile_vnni<R, BT>(c, n0, b0, v);
  for (int b = 0; b < BT; ++b)
    for (int r = 0; r < R; ++r) {
      float o = v[b * R + r];
      if (c.bias) o = o + c.bias[n0 + r];
      c.y[(b0 + b) * c.N + n0 + r] = o;
    }
}

template <int R>
PLK_VNNI4 inline void rows_vnni(const W4A8Ctx& c, int64_t n0) {
  int64_t b = 0;
  for (; b + 3 <= c.B; b += 3) emit_vnni<R, 3>(c, n0, b);
  if (c.B - b == 2) emit_vnni<R, 2>(c, n0, b);
  if (c.B - b == 1) emit_vnni<R, 1>(c, n0, b);
}

PLK_VNNI4 void range_vnni(void* ctx, int64_t n0, int64_t n1) {
  const W4A8Ctx& c = *static_cast<const W4A8Ctx*>(ctx);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) rows_vnni<4>(c, n);
  for (; n < n1; ++n) rows_vnni<1>(c, n);
}

struct Buffers {
  std::vector<int8_t> xq;
  std::vector<float> xs;
  std::vector<uint8_t> xe, xo;
  std::vector<float> xsl;
  std::vector<int32_t> gidx;
  std::vector<int64_t> gbase;
};

constexpr int64_t kBytesPerThread = 256 * 1024;

}  // namespace

void gemv_w4a8(Isa isa, const float* x, const uint8_t* q, const float* ws, int64_t groups, const float* bias,
               float* y, int64_t B, int64_t N, int64_t K) {
  (void)isa;  // only the VNNI path exists; the op refuses other isas
  // From as many rows as the int8 GEMM takes: the same scheme on its panels (exact int32 sums per
  // block of 32, then scaled: gemm_w8a8.cc), the weights unpacked to int8 per call.
  if (B >= kW8A8GemmMinRows) return w4a8_gemm_run(x, q, ws, groups, bias, y, B, N, K);
  thread_local Buffers buf;
  W4A8Ctx c{};
  c.B = B;
  c.N = N;
  c.K = K;
  c.H = K / 2;
  c.steps = (c.H + 63) / 64;
  c.Hp = c.steps * 64;
  c.groups = groups;
  c.G = K / groups;
  c.q = q;
  c.ws = ws;
  c.bias = bias;
  c.y = y;
  const int64_t blocks = K / 32;
  buf.xq.assign(B * K, 0);
  buf.xs.resize(B * blocks);
  quantize_activations_int8(x, buf.xq.data(), buf.xs.data(), B, K, K, 32);
  buf.xe.assign(B * c.Hp, 128);
  buf.xo.assign(B * c.Hp, 128);
  buf.xsl.assign(B * (c.Hp / 4), 0.f);
  for (int64_t b = 0; b < B; ++b) {
    const int8_t* xr = buf.xq.data() + b * K;
    for (int64_t h = 0; h < c.H; ++h) {
      buf.xe[b * c.Hp + h] = static_cast<uint8_t>(static_cast<int32_t>(xr[2 * h]) + 128);
      buf.xo[b * c.Hp + h] = static_cast<uint8_t>(static_cast<int32_t>(xr[2 * h + 1]) + 128);
    }
    for (int64_t l = 0; l < c.H / 4; ++l) buf.xsl[b * (c.Hp / 4) + l] = buf.xs[b * blocks + (8 * l) / 32];
  }
  buf.gidx.assign(c.steps * 16, 0);
  buf.gbase.assign(c.steps, 0);
  for (int64_t s = 0; s < c.steps; ++s) {
    buf.gbase[s] = (128 * s) / c.G;
    for (int i = 0; i < 16; ++i) {
      const int64_t k = 128 * s + 8 * i;
      buf.gidx[16 * s + i] = k < K ? static_cast<int32_t>(k / c.G - buf.gbase[s]) : 0;
    }
  }
  c.xe = buf.xe.data();
  c.xo = buf.xo.data();
  c.xsl = buf.xsl.data();
  c.gidx = buf.gidx.data();
  c.gbase = buf.gbase.data();
  const int64_t work = N * c.H + B * N * K / 8;
  parallel_ranges(N, 8, threads_for(work, kBytesPerThread), range_vnni, &c);
}

}  // namespace plk
