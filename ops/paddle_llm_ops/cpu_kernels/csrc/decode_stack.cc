// The whole decoder stack of a decode step in one call: for B sequences with one new token each,
// every layer's fused add + RMSNorm, qkv GEMV, rotary + paged KV write, paged decode attention,
// o GEMV, add + RMSNorm, gate_up GEMV, SwiGLU and down GEMV, then the final norm.
//
// Why: at batch 1 a decoder layer is ~9 small ops, and each op call from Python through Paddle's
// custom-op dispatch costs 10-40 us; for a 30-layer model that is ~6 ms per token, more than the
// time to stream the int8 weights. This calls the very same kernel functions in the same order as
// the per-op path, so its outputs (hidden states and KV cache) are bit-identical to it.
// It is reached through ctypes (plk_decode_stack), which releases the GIL for the whole call.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace plk {
namespace {

int64_t act_group_for(int64_t group, int64_t K) { return (group <= 0 || group >= K) ? K : group; }

// CBLAS's sgemm (row-major 101, no-trans 111, trans 112; MKL's LP64 ints).
typedef void (*SgemmFn)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);

void run_linear(Isa isa, const PlkLinear& l, const float* x, float* y, int64_t B, int64_t act_group,
                const PlkDecodeStack& a) {
  switch (l.kind) {
    case kLinearF32:
      if (f32_gemm_rows(isa, B)) {  // as cpu_kernels.linear on this isa
        gemm_f32_avx512(x, static_cast<const float*>(l.w), l.bias, y, B, l.N, l.K);
      } else if (a.sgemm && B > a.gemv_max_batch) {  // as paddle.matmul(x, w, transpose_y=True) (+ bias)
        reinterpret_cast<SgemmFn>(const_cast<void*>(a.sgemm))(
            101, 111, 112, static_cast<int>(B), static_cast<int>(l.N), static_cast<int>(l.K), 1.0f, x,
            static_cast<int>(l.K), static_cast<const float*>(l.w), static_cast<int>(l.K), 0.0f, y, static_cast<int>(l.N));
        if (l.bias)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t n = 0; n < l.N; ++n) y[b * l.N + n] += l.bias[n];
      } else {
        gemv_f32(isa, x, static_cast<const float*>(l.w), l.bias, y, B, l.N, l.K);
      }
      break;
    case kLinearInt8:
      gemv_int8(isa, x, static_cast<const int8_t*>(l.w), l.scale, l.bias, y, B, l.N, l.K);
      break;
    case kLinearW8A8:
      gemv_w8a8(isa, x, static_cast<const int8_t*>(l.w), l.scale, l.bias, y, B, l.N, l.K,
                act_group_for(act_group, l.K));
      break;
    case kLinearW4A8:
      gemv_w4a8(isa, x, static_cast<const uint8_t*>(l.w), l.scale, l.groups, l.bias, y, B, l.N, l.K);
      break;
    default:  // kLinearInt4 (checked before the run)
      gemv_int4(isa, x, static_cast<const uint8_t*>(l.w), l.scale, l.groups, l.bias, y, B, l.N, l.K);
      break;
  }
}

// LoRA deltas of projections m0 .. m1 - 1 (0 q, 1 k, 2 v, 3 o, 4 gate, 5 up, 6 down) of layer
// `layer` into their fused linear's output y [B, N] (input x [B, K]): for each adapter slot, its rows
// of x are gathered, t = x a^T [n, r] (the GEMV streams a once for the rows), then each row adds
// t[j] * b[j, :] into its columns col .. col + n (b rows contiguous, so the loop vectorizes; a GEMV
// over n outputs of only r inputs each would be mostly overhead).
void add_lora(Isa isa, const PlkDecodeStack& a, int64_t layer, int64_t m0, int64_t m1, const float* x, float* y,
              int64_t B, int64_t N, int64_t K, std::vector<float>& scratch) {
  if (!a.lora_rows) return;
  std::vector<int64_t> rows;
  for (int64_t s = 0; s < a.lora_slots; ++s) {
    rows.clear();
    for (int64_t b = 0; b < B; ++b)
      if (a.lora_rows[b] == s) rows.push_back(b);
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    bool gathered = false;
    for (int64_t m = m0; m < m1; ++m) {
      const PlkLora& f = a.lora[(layer * 7 + m) * a.lora_slots + s];
      if (f.r == 0) continue;
      scratch.resize(static_cast<size_t>(n * (K + f.r)));
      float* xg = scratch.data();
      float* t = xg + n * K;
      if (!gathered)
        for (int64_t i = 0; i < n; ++i) std::memcpy(xg + i * K, x + rows[i] * K, sizeof(float) * K);
      gathered = true;
      gemv_f32(isa, xg, f.a, nullptr, t, n, f.r, K);
      for (int64_t i = 0; i < n; ++i) {
        float* __restrict yr = y + rows[i] * N + f.col;
        for (int64_t j = 0; j < f.r; ++j) {
          const float tj = t[i * f.r + j];
          const float* __restrict bj = f.b + j * f.n;
          for (int64_t c = 0; c < f.n; ++c) yr[c] += tj * bj[c];
        }
      }
    }
  }
}

struct Err {
  char* buf;
  int64_t len;
  bool fail(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
};

bool Err::fail(const char* fmt, ...) {
  if (buf && len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, static_cast<size_t>(len), fmt, ap);
    va_end(ap);
  }
  return false;
}

bool check_linear(const PlkLinear& l, const char* name, int64_t layer, int64_t N, int64_t K, int64_t act_group,
                  Err& e) {
  if (!l.w) return e.fail("layer %lld %s: no weight", (long long)layer, name);
  if (l.N != N || l.K != K)
    return e.fail("layer %lld %s is [%lld, %lld], expected [%lld, %lld]", (long long)layer, name, (long long)l.N,
                  (long long)l.K, (long long)N, (long long)K);
  if (l.kind < kLinearF32 || l.kind > kLinearW4A8) return e.fail("layer %lld %s: unknown linear kind %lld",
                                                                  (long long)layer, name, (long long)l.kind);
  if (l.kind != kLinearF32 && !l.scale) return e.fail("layer %lld %s: no scale", (long long)layer, name);
  if (l.kind == kLinearW8A8) {
    const int64_t G = act_group_for(act_group, K);
    if (!(G == K || G % 32 == 0) || G > 65536)
      return e.fail("activation group %lld must be 0 (per row) or a multiple of 32 up to 65536", (long long)act_group);
  }
  if (l.kind == kLinearInt4 && (l.groups < 1 || K % l.groups || (l.groups > 1 && (K / l.groups) % 8)))
    return e.fail("layer %lld %s: K = %lld does not split into %lld groups of a multiple of 8", (long long)layer, name,
                  (long long)K, (long long)l.groups);
  if (l.kind == kLinearW4A8 && (l.groups < 1 || K % 32 || K % l.groups || (K / l.groups) % 32))
    return e.fail("layer %lld %s: K = %lld does not split into %lld groups of a multiple of 32 (int4 x int8)",
                  (long long)layer, name, (long long)K, (long long)l.groups);
  return true;
}

bool check(const PlkDecodeStack& a, Err& e) {
  if (a.isa == static_cast<int64_t>(Isa::kAvx2Fma) && !cpu_has_avx2_fma())
    return e.fail("isa 'avx2_fma' requested but this CPU (or OS) does not support AVX2 and FMA");
  if (a.isa == static_cast<int64_t>(Isa::kAvx512Vnni) && !cpu_has_avx512_vnni())
    return e.fail("isa 'avx512_vnni' requested but this CPU (or OS) does not support AVX-512 F/BW/VNNI");
  if (a.isa < 0 || a.isa > 2) return e.fail("unknown isa %lld", (long long)a.isa);
  if (a.kv_dtype < 0 || a.kv_dtype > 2)
    return e.fail("unknown kv_dtype %lld (0 float32, 1 bfloat16, 2 float16)", (long long)a.kv_dtype);
  if (a.B < 1 || a.H < 1 || a.I < 1 || a.num_layers < 1) return e.fail("B, H, I and num_layers must be positive");
  if (a.nh < 1 || a.kvh < 1 || a.nh % a.kvh || a.nh / a.kvh > 16)
    return e.fail("num_heads %lld must be a multiple of num_kv_heads %lld, at most 16 per KV head", (long long)a.nh,
                  (long long)a.kvh);
  if (a.d < 2 || a.d % 2 || a.d > 1024) return e.fail("head_dim must be even and <= 1024, got %lld", (long long)a.d);
  if (a.block_size < 1 || a.S % a.block_size)
    return e.fail("block_size %lld must divide the cache slots %lld", (long long)a.block_size, (long long)a.S);
  if (!a.embeddings || !a.positions || !a.cos || !a.sin || !a.slots || !a.block_tables || !a.context_lens ||
      !a.final_norm || !a.layers || !a.out)
    return e.fail("a required pointer is null");
  const int64_t qkv_n = (a.nh + 2 * a.kvh) * a.d, num_blocks = a.S / a.block_size;
  for (int64_t i = 0; i < a.num_layers; ++i) {
    const PlkLayer& l = a.layers[i];
    if (!l.in_norm || !l.post_norm || !l.k_cache || !l.v_cache) return e.fail("layer %lld: a null pointer", (long long)i);
    if (!l.q_norm != !l.k_norm) return e.fail("layer %lld: give both q_norm and k_norm or neither", (long long)i);
    if (!check_linear(l.qkv, "qkv", i, qkv_n, a.H, a.act_group, e) ||
        !check_linear(l.o, "o", i, a.H, a.nh * a.d, a.act_group, e) ||
        !check_linear(l.gate_up, "gate_up", i, 2 * a.I, a.H, a.act_group, e) ||
        !check_linear(l.down, "down", i, a.H, a.I, a.act_group, e))
      return false;
    const bool w4a8 = l.qkv.kind == kLinearW4A8 || l.o.kind == kLinearW4A8 || l.gate_up.kind == kLinearW4A8 ||
                      l.down.kind == kLinearW4A8;
    if (w4a8 && a.isa != static_cast<int64_t>(Isa::kAvx512Vnni))
      return e.fail("layer %lld: int4 x int8 linears run on isa avx512_vnni only", (long long)i);
  }
  if (a.lora_rows) {
    if (!a.lora || a.lora_slots < 1) return e.fail("lora_rows given without a LoRA table of >= 1 slot");
    for (int64_t b = 0; b < a.B; ++b)
      if (a.lora_rows[b] < -1 || a.lora_rows[b] >= a.lora_slots)
        return e.fail("lora_rows[%lld] = %lld outside [-1, %lld)", (long long)b, (long long)a.lora_rows[b],
                      (long long)a.lora_slots);
    const int64_t qkv_n = (a.nh + 2 * a.kvh) * a.d;
    const int64_t width[7] = {qkv_n, qkv_n, qkv_n, a.H, 2 * a.I, 2 * a.I, a.H};
    for (int64_t i = 0; i < a.num_layers * 7 * a.lora_slots; ++i) {
      const PlkLora& f = a.lora[i];
      const int64_t w = width[(i / a.lora_slots) % 7];
      if (f.r < 0 || f.r > 4096 || (f.r > 0 && (!f.a || !f.b || f.col < 0 || f.n < 1 || f.col + f.n > w)))
        return e.fail("LoRA table entry %lld: rank %lld, columns %lld + %lld of %lld, factors %p / %p", (long long)i,
                      (long long)f.r, (long long)f.col, (long long)f.n, (long long)w, (const void*)f.a,
                      (const void*)f.b);
    }
  }
  for (int64_t b = 0; b < a.B; ++b) {
    if (a.positions[b] < 0 || a.positions[b] >= a.P)
      return e.fail("positions[%lld] = %lld outside the rotary table [0, %lld)", (long long)b,
                    (long long)a.positions[b], (long long)a.P);
    if (a.slots[b] < 0 || a.slots[b] >= a.S)
      return e.fail("slot_mapping[%lld] = %lld outside the cache [0, %lld)", (long long)b, (long long)a.slots[b],
                    (long long)a.S);
    const int32_t len = a.context_lens[b];
    if (len < 0 || len > a.max_blocks * a.block_size)
      return e.fail("context_lens[%lld] = %d outside [0, max_blocks * block_size = %lld]", (long long)b, len,
                    (long long)(a.max_blocks * a.block_size));
    for (int64_t j = 0; j * a.block_size < len; ++j) {
      const int32_t blk = a.block_tables[b * a.max_blocks + j];
      if (blk < 0 || blk >= num_blocks)
        return e.fail("block_tables[%lld, %lld] = %d outside the cache's blocks [0, %lld)", (long long)b,
                      (long long)j, blk, (long long)num_blocks);
    }
  }
  return true;
}

}  // namespace

void decode_stack(const PlkDecodeStack& a) {
  const Isa isa = static_cast<Isa>(a.isa);
  const int64_t B = a.B, H = a.H, I = a.I, nh = a.nh, kvh = a.kvh, d = a.d;
  const float eps = static_cast<float>(a.eps);
  // Scratch: residual h, normed x, qkv, rotated q, attention out, o / down out, gate_up, SwiGLU out.
  std::vector<float> buf(static_cast<size_t>(B * (4 * H + (nh + 2 * kvh) * d + 2 * nh * d + 3 * I)));
  float* h = buf.data();
  float* x = h + B * H;
  float* proj = x + B * H;      // [B, H]: o's and down's output (the `delta` not yet added to h)
  float* normed = proj + B * H;  // [B, H]
  float* qkv = normed + B * H;
  float* q = qkv + B * (nh + 2 * kvh) * d;
  float* attn = q + B * nh * d;
  float* gu = attn + B * nh * d;
  float* act = gu + B * 2 * I;
  std::memcpy(h, a.embeddings, sizeof(float) * B * H);

  RotaryKvArgs r{};
  r.qkv = qkv;
  r.positions = a.positions;
  r.cos = a.cos;
  r.sin = a.sin;
  r.slots = a.slots;
  r.eps = eps;
  r.q_out = q;
  r.T = B;
  r.nh = nh;
  r.kvh = kvh;
  r.d = d;
  r.S = a.S;
  r.kv_dtype = static_cast<KvDtype>(a.kv_dtype);
  DecodeAttnArgs at{};
  at.q = q;
  at.block_tables = a.block_tables;
  at.context_lens = a.context_lens;
  at.out = attn;
  at.B = B;
  at.nh = nh;
  at.kvh = kvh;
  at.d = d;
  at.S = a.S;
  at.max_blocks = a.max_blocks;
  at.block_size = a.block_size;
  at.scale = static_cast<float>(a.scale);
  at.kv_dtype = static_cast<KvDtype>(a.kv_dtype);

  std::vector<float> lora_scratch;
  const int64_t qkv_n = (nh + 2 * kvh) * d;
  bool have_delta = false;  // proj holds the previous layer's MLP output, not yet added to h
  for (int64_t i = 0; i < a.num_layers; ++i) {
    const PlkLayer& l = a.layers[i];
    // The residual add writes h in place: the kernel reads residual[k] before writing sum[k].
    if (have_delta)
      rms_norm(isa, proj, h, l.in_norm, eps, normed, h, B, H);
    else
      rms_norm(isa, h, nullptr, l.in_norm, eps, normed, nullptr, B, H);
    run_linear(isa, l.qkv, normed, qkv, B, a.act_group, a);
    add_lora(isa, a, i, 0, 3, normed, qkv, B, qkv_n, H, lora_scratch);
    r.q_norm = l.q_norm;
    r.k_norm = l.k_norm;
    r.k_cache = l.k_cache;
    r.v_cache = l.v_cache;
    rotary_kv_write(isa, r);
    at.k_cache = l.k_cache;
    at.v_cache = l.v_cache;
    paged_decode_attention(isa, at);
    run_linear(isa, l.o, attn, proj, B, a.act_group, a);
    add_lora(isa, a, i, 3, 4, attn, proj, B, H, nh * d, lora_scratch);
    rms_norm(isa, proj, h, l.post_norm, eps, normed, h, B, H);
    run_linear(isa, l.gate_up, normed, gu, B, a.act_group, a);
    add_lora(isa, a, i, 4, 6, normed, gu, B, 2 * I, H, lora_scratch);
    silu_mul(isa, gu, act, B, I);
    run_linear(isa, l.down, act, proj, B, a.act_group, a);
    add_lora(isa, a, i, 6, 7, act, proj, B, H, I, lora_scratch);
    have_delta = true;
  }
  rms_norm(isa, proj, h, a.final_norm, eps, a.out, x, B, H);
}

}  // namespace plk

// Returns 0 on success, else 1 with a message in err (nothing run, caches untouched).
extern "C" int plk_decode_stack(const plk::PlkDecodeStack* a, char* err, int64_t err_len) {
  plk::Err e{err, err_len};
  if (!a) return e.fail("no arguments"), 1;
  if (!plk::check(*a, e)) return 1;
  plk::decode_stack(*a);
  return 0;
}
