// Plain C++ entry points of the kernels (no Paddle types). Shapes are row-major and contiguous;
// the op registrations (ops_*.cc) check shapes, dtypes and index bounds before calling these.
#pragma once

#include <cstdint>

#include "common.h"
#include "kv_dtype.h"

namespace plk {

float hsum8_(const float* lanes);  // ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7))

// y [B, N] = x [B, K] . w [N, K]^T (+ bias [N]).
void gemv_f32(Isa isa, const float* x, const float* w, const float* bias, float* y, int64_t B, int64_t N,
              int64_t K);
// y [B, N] = (x [B, K] . q [N, K]^T) * scale [N] (+ bias [N]).
void gemv_int8(Isa isa, const float* x, const int8_t* q, const float* scale, const float* bias, float* y,
               int64_t B, int64_t N, int64_t K);
// int8 activations x int8 weights (gemv_w8a8.cc, kernels in gemv_w8a8_tiles.cc): x [B, K] fp32 is
// quantized per row and group of G input channels (G = K: per row),
// y [B, N] = sum_g xs[b, g] * acc[b, n, g] * scale[n] (+ bias).
void gemv_w8a8(Isa isa, const float* x, const int8_t* q, const float* scale, const float* bias, float* y, int64_t B,
               int64_t N, int64_t K, int64_t G);
// acc [B, N, ceil(K / G)] int32: the exact group sums of xq [B, K] int8 times q [N, K] int8.
void int8_dot_groups(Isa isa, const int8_t* xq, const int8_t* q, int32_t* acc, int64_t B, int64_t N, int64_t K,
                     int64_t G);
// xq [B, ldq] int8 and xs [B, ceil(K / G)] fp32 from x [B, K] (symmetric, per row and group).
void quantize_activations_int8(const float* x, int8_t* xq, float* xs, int64_t B, int64_t K, int64_t ldq, int64_t G);
void quantize_int8_rows(const float* w, int8_t* q, float* scale, int64_t N, int64_t K);
// fp32 tiles over nr rows w [nr, K] on the calling thread; y [B, ldy] and bias already offset to
// the block's first output column.
// The fp32 GEMM (gemm_f32.cc, AVX-512: the avx512_vnni path only): y [B, N] = x [B, K] . w [N, K]^T
// (+ bias). fp32 linears of more than kGemvMaxBatch and at most kF32GemmMaxRows rows run it on that
// path, in the decode stack and in cpu_kernels.linear alike (f32_gemm_rows).
constexpr int64_t kGemvMaxBatch = 16;     // cpu_kernels.GEMV_MAX_BATCH
constexpr int64_t kF32GemmMaxRows = 64;   // cpu_kernels.F32_GEMM_MAX_ROWS
inline bool f32_gemm_rows(Isa isa, int64_t B) {
  return isa == Isa::kAvx512Vnni && B > kGemvMaxBatch && B <= kF32GemmMaxRows;
}
void gemm_f32_avx512(const float* x, const float* w, const float* bias, float* y, int64_t B, int64_t N, int64_t K);
void gemv_f32_block(Isa isa, const float* x, const float* w, const float* bias, float* y, int64_t B, int64_t ldy,
                    int64_t K, int64_t nr);
// y [B, N] = x [B, K] . w'^T (+ bias [N]) with w'[n, k] = int4 q[n, k] * scale[n, k / (K / groups)];
// q [N, ceil(K/2)] two signed nibbles per byte (low = even k), scale [N, groups] (gemv_int4.cc).
void gemv_int4(Isa isa, const float* x, const uint8_t* q, const float* scale, int64_t groups, const float* bias,
               float* y, int64_t B, int64_t N, int64_t K);
// int4 weights (gemv_int4's layout) x int8 activations quantized per row and block of 32 input
// channels, AVX-512 VNNI only (gemv_w4a8.cc); K and K / groups multiples of 32.
void gemv_w4a8(Isa isa, const float* x, const uint8_t* q, const float* scale, int64_t groups, const float* bias,
               float* y, int64_t B, int64_t N, int64_t K);
// out [N, K] = w' (the dequantized weight the int4 GEMV multiplies by).
void dequantize_int4(Isa isa, const uint8_t* q, const float* scale, int64_t groups, float* out, int64_t N,
                     int64_t K);

// y = x / sqrt(mean(x^2) + eps) * w over rows of H; with residual: s = x + residual is written to
// sum_out and normalized.
void rms_norm(Isa isa, const float* x, const float* residual, const float* w, float eps, float* y, float* sum_out,
              int64_t T, int64_t H);

struct RotaryKvArgs {
  const float* qkv;        // [T, (nh + 2 kvh) * d]
  const int64_t* positions;  // [T]
  const float* cos;        // [P, d]
  const float* sin;        // [P, d]
  const int64_t* slots;    // [T]
  const float* q_norm;     // [d] or null (per-head RMSNorm of q before rotation)
  const float* k_norm;     // [d] or null
  float eps;
  float* q_out;            // [T, nh, d]
  void* k_cache;           // [kvh, S, d] in kv_dtype
  void* v_cache;           // [kvh, S, d] in kv_dtype
  int64_t T, nh, kvh, d, S;
  KvDtype kv_dtype;
};
void rotary_kv_write(Isa isa, const RotaryKvArgs& a);

struct DecodeAttnArgs {
  const float* q;          // [B, nh, d]
  const void* k_cache;     // [kvh, S, d] in kv_dtype
  const void* v_cache;
  const int32_t* block_tables;  // [B, max_blocks]
  const int32_t* context_lens;  // [B]
  float* out;              // [B, nh * d]
  int64_t B, nh, kvh, d, S, max_blocks, block_size;
  float scale;
  KvDtype kv_dtype;
};
void paged_decode_attention(Isa isa, const DecodeAttnArgs& a);

// Causal attention of one sequence's chunk of n new tokens (positions start_pos .. start_pos + n - 1,
// their K/V already in the cache) over its context, read from the cache by slot (attention.cc):
//   out[i, h] = softmax_p(scale * q[i, h] . K[g, slots[p]]) . V[g, slots[p]],  p <= start_pos + i
struct PrefillAttnArgs {
  const float* q;          // [n, nh, d]
  const void* k_cache;     // [kvh, S, d] in kv_dtype
  const void* v_cache;
  const int64_t* slots;    // [start_pos + n]: the cache slot of every position
  float* out;              // [n, nh * d]
  int64_t n, start_pos, nh, kvh, d, S;
  float scale;
  KvDtype kv_dtype;
};
void paged_prefill_attention(Isa isa, const PrefillAttnArgs& a);

// out [B, I] = silu(gu[:, :I]) * gu[:, I:] for gu [B, 2I] (activation.cc).
void silu_mul(Isa isa, const float* gu, float* out, int64_t B, int64_t I);

// ----------------------------------------------------------------- the decode stack (decode_stack.cc)
// Plain-old-data layouts shared with Python's ctypes (cpu_kernels/decode_stack.py mirrors them field
// for field: every integer is int64_t and every real a double, so no padding rule can differ).
enum LinearKind : int64_t { kLinearF32 = 0, kLinearInt8 = 1, kLinearW8A8 = 2, kLinearInt4 = 3, kLinearW4A8 = 4 };

struct PlkLinear {
  int64_t kind;        // LinearKind: f32 w [N, K]; int8 / w8a8 q [N, K] int8 + scale [N]; int4 / w4a8 q [N, ceil(K/2)] uint8 + scale [N, groups]
  int64_t groups;      // int4 scale groups per row (1: per output channel)
  const void* w;
  const float* scale;  // null for f32
  const float* bias;   // [N] or null
  int64_t N, K;
};

struct PlkLayer {
  const float* in_norm;    // [H]
  const float* post_norm;  // [H]
  const float* q_norm;     // [d] or null (Qwen3's per-head norms; both or neither)
  const float* k_norm;
  PlkLinear qkv, o, gate_up, down;  // [(nh + 2 kvh) d, H], [H, nh d], [2I, H] (gate rows first), [H, I]
  void* k_cache;           // [kvh, S, d] in the stack's kv_dtype
  void* v_cache;
};

// One LoRA adapter's factors on one projection (fp32, the adapter's scale folded into b): the rows
// of that adapter get y[:, col:col + n] += (a x) b over the output of the projection's fused linear
// (q, k, v in qkv; gate, up in gate_up). r = 0: the adapter leaves this projection alone.
struct PlkLora {
  const float* a;  // [r, K]
  const float* b;  // [r, n]
  int64_t r, col, n;
};

struct PlkDecodeStack {
  int64_t isa;           // Isa
  int64_t act_group;     // w8a8 activation group (0: per row)
  int64_t B, H, I, nh, kvh, d, S, P, max_blocks, block_size, num_layers;
  double eps, scale;     // RMSNorm epsilon; attention scale (cast to float as the per-op attributes are)
  const float* embeddings;      // [B, H] the token embeddings (the residual stream's start)
  const int64_t* positions;     // [B]
  const float* cos;             // [P, d]
  const float* sin;             // [P, d]
  const int64_t* slots;         // [B] cache slot of each new token
  const int32_t* block_tables;  // [B, max_blocks]
  const int32_t* context_lens;  // [B] keys each sequence sees, the new token included
  const float* final_norm;      // [H]
  const PlkLayer* layers;       // [num_layers]
  float* out;                   // [B, H] the final norm's output
  // fp32 linears above gemv_max_batch rows: cblas_sgemm (MKL's, the one Paddle's matmul calls, so
  // the result equals the op-by-op path's paddle.matmul); null: the GEMV at any batch.
  const void* sgemm;
  int64_t gemv_max_batch;
  int64_t kv_dtype;             // KvDtype of every layer's cache
  // LoRA (null lora_rows: no row has an adapter): each row's adapter slot (-1: none) and the
  // factors, [num_layers][7: q, k, v, o, gate, up, down][lora_slots].
  const int64_t* lora_rows;     // [B]
  const PlkLora* lora;
  int64_t lora_slots;
};
void decode_stack(const PlkDecodeStack& a);

}  // namespace plk
