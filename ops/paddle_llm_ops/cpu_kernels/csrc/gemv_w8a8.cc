// int8 x int8 GEMV / skinny GEMM for the decode batch (wint8 with dynamically quantized activations).
//
//   xs[b, g]  = max_{k in group g} |x[b, k]| / 127                       (fp32 division)
//   xq[b, k]  = clamp(round-half-even(x[b, k] / xs[b, g]), -127, 127)     (an all-zero group: 0)
//   acc[b, n, g] = sum_{k in group g} xq[b, k] * q[n, k]                  (exact, int32)
//   v[b, n]   = sum_g xs[b, g] * float(acc[b, n, g])   (g ascending, one rounded multiply and one
//               rounded add per group, starting from 0)
//   y[b, n]   = v[b, n] * scale[n] (+ bias[n])
//
// This is llama.cpp's scheme for Q8_0 weights (ggml_vec_dot_q8_0_q8_0: activations quantized to
// int8 once per call, integer dot products, fp32 scales applied per block), with our per-output-
// channel weight scale. The integer sums are exact, so every ISA path gives the same acc. The exact
// path (any group; int8_dot_groups) reduces each group to a scalar and applies the epilogue above
// in a fixed scalar order: the same y bit for bit on every isa. Groups of exactly 32 (what wint8
// uses) on the vector isas take the lane paths instead: the same integer products per lane,
// scaled and summed in fp32 lanes (llama.cpp's order), within fp32 rounding of the exact path.
//
// This file holds the activation quantization, the per-call buffers and the entry points; the tile
// kernels of each isa (the exact group sums and the lane paths) are in gemv_w8a8_tiles.cc, so that
// the isa-specific code reads apart from the scheme's scalar steps.
#include <cstring>
#include <vector>

#include "common.h"
#include "gemv_w8a8.h"
#include "kernels.h"

namespace plk {
namespace {

// Activation rows are padded with zeros to a multiple of 64 bytes plus 64: a group may start at any
// multiple of 32, and the VNNI path reads 64 bytes of x from there (the weights beyond the group
// are masked to zero, so those x bytes only ever meet zeros).
constexpr int64_t kPad = 64;

// Per-call activation buffers (thread_local: ops may run on several Python threads).
struct Buffers {
  std::vector<int8_t> xq;
  std::vector<uint8_t> xu;
  std::vector<float> xs;
  std::vector<float> xsl;
};

W8A8Ctx make_ctx(Isa isa, const int8_t* xq_in, const float* x, const int8_t* q, int64_t B, int64_t N, int64_t K,
                 int64_t G, Buffers& buf) {
  W8A8Ctx c{};
  c.B = B;
  c.N = N;
  c.K = K;
  c.G = G;
  c.groups = (K + G - 1) / G;
  c.Kp = (K + kPad - 1) / kPad * kPad + kPad;
  c.q = q;
  if (x && isa == Isa::kAvx512Vnni) {  // vectorized and threaded: xq, xu and xs in one pass
    buf.xq.resize(B * c.Kp);
    buf.xu.resize(B * c.Kp);
    buf.xs.resize(B * c.groups);
    quantize_activations_vnni(x, buf.xq.data(), buf.xu.data(), buf.xs.data(), B, K, c.Kp, G);
    c.xu = buf.xu.data();
    c.xs = buf.xs.data();
  } else if (x) {
    buf.xq.assign(B * c.Kp, 0);
    buf.xs.resize(B * c.groups);
    quantize_activations_int8(x, buf.xq.data(), buf.xs.data(), B, K, c.Kp, G);
    c.xs = buf.xs.data();
  } else {
    buf.xq.assign(B * c.Kp, 0);
    for (int64_t b = 0; b < B; ++b) std::memcpy(buf.xq.data() + b * c.Kp, xq_in + b * K, K);
  }
  c.xq = buf.xq.data();
  if (isa == Isa::kAvx512Vnni) {
    if (c.xu == nullptr) {
      buf.xu.resize(B * c.Kp);
      for (int64_t i = 0; i < B * c.Kp; ++i) buf.xu[i] = static_cast<uint8_t>(static_cast<int32_t>(buf.xq[i]) + 128);
      c.xu = buf.xu.data();
    }
    if (x && G == 32 && !w8a8_gemm_applies(isa, c)) {  // lane paths: one scale per dpbusd lane (4 k), zero past K
      buf.xsl.assign(B * (c.Kp / 4), 0.f);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; 4 * j < K; ++j) buf.xsl[b * (c.Kp / 4) + j] = buf.xs[b * c.groups + 4 * j / 32];
      c.xsl = buf.xsl.data();
    }
  }
  return c;
}

}  // namespace

void quantize_activations_int8(const float* x, int8_t* xq, float* xs, int64_t B, int64_t K, int64_t ldq, int64_t G) {
  const int64_t groups = (K + G - 1) / G;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
      const float* xr = x + b * K;
      float m = 0.f;
      for (int64_t k = k0; k < k1; ++k) {
        float a = xr[k] < 0 ? -xr[k] : xr[k];
        m = a > m ? a : m;
      }
      const float s = m / 127.0f;
      xs[b * groups + g] = s;
      int8_t* qr = xq + b * ldq;
      for (int64_t k = k0; k < k1; ++k) {
        float v = s > 0.f ? __builtin_nearbyintf(xr[k] / s) : 0.f;
        v = v > 127.f ? 127.f : (v < -127.f ? -127.f : v);
        qr[k] = static_cast<int8_t>(v);
      }
    }
}

void gemv_w8a8(Isa isa, const float* x, const int8_t* q, const float* scale, const float* bias, float* y, int64_t B,
               int64_t N, int64_t K, int64_t G) {
  thread_local Buffers buf;
  W8A8Ctx c = make_ctx(isa, nullptr, x, q, B, N, K, G, buf);
  c.scale = scale;
  c.bias = bias;
  c.y = y;
  w8a8_run(isa, c);
}

void int8_dot_groups(Isa isa, const int8_t* xq, const int8_t* q, int32_t* acc, int64_t B, int64_t N, int64_t K,
                     int64_t G) {
  thread_local Buffers buf;
  W8A8Ctx c = make_ctx(isa, xq, nullptr, q, B, N, K, G, buf);
  c.acc_out = acc;
  w8a8_run(isa, c);
}

}  // namespace plk
