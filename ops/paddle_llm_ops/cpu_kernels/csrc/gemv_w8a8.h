// What the two files of the int8 x int8 GEMV share: the per-call context that gemv_w8a8.cc (the
// activation quantization and the entry points) fills and hands to the tile kernels of
// gemv_w8a8_tiles.cc, and the one call between them. Internal to those two files.
#pragma once

#include <cstdint>

#include "common.h"

namespace plk {

struct W8A8Ctx {
  const int8_t* xq;   // [B, Kp] quantized activations, zero-padded (generic / AVX2)
  const uint8_t* xu;  // [B, Kp] xq + 128 (VNNI); padding 128 meets zero weights
  const float* xs;    // [B, groups]
  const int8_t* q;    // [N, K]
  const float* scale;  // [N] or null (accumulator output)
  const float* bias;   // [N] or null
  float* y;            // [B, N] (float output)
  int32_t* acc_out;    // [B, N, groups] (accumulator output) or null
  const float* xsl;    // [B, Kp / 4]: xs of the group of k = 4 j, 0 past K (VNNI lane path, G = 32)
  int64_t B, N, K, Kp, G, groups;  // Kp: the padded row stride of xq / xu (kPad in gemv_w8a8.cc)
  // int4 weights instead of q (the GEMM only, gemv_w4a8.cc's layout): q4 [N, K / 2] two's-complement
  // nibbles (low = even k), ws [N, wgroups] fp32 per group of K / wgroups input channels (a multiple
  // of G); scale is then null.
  const uint8_t* q4;
  const float* ws;
  int64_t wgroups;
};

// Runs the tile kernels of `isa` over the N output rows (threaded): y, or acc_out when set. From
// w8a8_gemm_min_rows activation rows on AVX-512 VNNI (float output, xs set) the GEMM of
// gemm_w8a8.cc runs instead: the exact path's result bit for bit.
void w8a8_run(Isa isa, W8A8Ctx& c);

// The GEMM (gemm_w8a8.cc): whether it serves `c`, and the run itself.
constexpr int64_t kW8A8GemmMinRows = 16;
bool w8a8_gemm_applies(Isa isa, const W8A8Ctx& c);
void w8a8_gemm_run(W8A8Ctx& c);
// quantize_activations_int8 (kernels.h) on AVX-512, threaded over rows, writing xq and xu = xq + 128
// ([B, Kp], padded: xq 0, xu 128 past K) and xs [B, groups]: the same values.
void quantize_activations_vnni(const float* x, int8_t* xq, uint8_t* xu, float* xs, int64_t B, int64_t K, int64_t Kp,
                               int64_t G);
// int4 x int8 through the same GEMM (gemv_w4a8.cc's scheme with exact int32 sums per block of 32):
// y[b, n] = sum_g float(acc[b, n, g]) * (xs[b, g] * ws[n, group of g]) (+ bias); K a multiple of 32.
void w4a8_gemm_run(const float* x, const uint8_t* q, const float* ws, int64_t wgroups, const float* bias, float* y,
                   int64_t B, int64_t N, int64_t K);
// Benchmarks and tests: the fewest rows that take the GEMM (<= 0: kW8A8GemmMinRows).
void set_w8a8_gemm_min_rows(int64_t rows);

}  // namespace plk
