// Stand-in reference kernels of paddle-custom-gcu's per-layer custom ops (tests only; NOT an Enflame
// GCU): rms_norm_gcu, fused_add_rms_norm_op, fused_rotary_embedding_gcu, reshape_and_cache_flash_gcu,
// flash_attn_var_len_gcu. Names, input orders, attribute names / types / orders, outputs and
// in-place maps are those of PaddleCustomDevice backends/gcu/custom_op (PD_BUILD_OP); the bodies are
// plain loops with float / double accumulation. Where the real op requires something (ranks,
// dtypes, max_seqlen bounds) the stand-in checks it and raises, so what passes here is what the
// real op accepts.
//
// Build variant STANDIN_VARIANT_BROKEN (tests of the plan's fallbacks): rms_norm_gcu allocates its
// output and fills it with garbage; flash_attn_var_len_gcu is registered without `softcap` and with
// an extra attribute `head_size: int`.

#include <algorithm>
#include <limits>

#include "standin_ops.h"

using standin::Dim;
using standin::Shape;

// ------------------------------------------------------------------------------ RMSNorm
// out = x / sqrt(mean(x^2) + epsilon) * weight over the last axis (Zhang & Sennrich 2019); the
// real op allocates its outputs in weight's dtype.
template <typename T, typename W>
static void RmsNormRows(const T* x, const W* w, W* out, int64_t rows, int64_t hidden, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < hidden; ++i) {
      double v = static_cast<float>(x[r * hidden + i]);
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(hidden) + static_cast<double>(eps));
    for (int64_t i = 0; i < hidden; ++i) {
      const double v = static_cast<float>(x[r * hidden + i]) * inv * static_cast<float>(w[i]);
      out[r * hidden + i] = static_cast<W>(static_cast<float>(v));
    }
  }
}

static void CheckNormOperands(const char* op, const paddle::Tensor& x, const paddle::Tensor& weight) {
  PD_CHECK(weight.shape().size() == 1 && Dim(weight, 0) == Dim(x, -1), op, ": weight ", Shape(weight),
           " must be [hidden] with hidden = x's last dim, x ", Shape(x));
  PD_CHECK(x.dtype() == weight.dtype(), op, ": x and weight dtypes differ (",
           phi::DataTypeToString(x.dtype()), " vs ", phi::DataTypeToString(weight.dtype()), ")");
}

std::vector<paddle::Tensor> RmsNormGcu(const paddle::Tensor& x, const paddle::Tensor& weight, float epsilon) {
  standin::LogCall("rms_norm_gcu", x);
  CheckNormOperands("rms_norm_gcu", x, weight);
  paddle::Tensor out = standin::Empty(x.shape(), weight.dtype(), x.place());
  const int64_t hidden = Dim(x, -1);
  const int64_t rows = hidden ? x.numel() / hidden : 0;
#ifdef STANDIN_VARIANT_BROKEN
  // The paddle-custom-gcu "stub kernel" pattern: allocate, compute nothing. Garbage, not zeros.
  (void)rows;
  (void)epsilon;
  STANDIN_DISPATCH_FLOAT(out.dtype(), "rms_norm_gcu", [&] {
    data_t* o = standin::Mutable<data_t>(out);
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = static_cast<data_t>(1234.5f + static_cast<float>(i % 97));
  });
#else
  STANDIN_DISPATCH_FLOAT(x.dtype(), "rms_norm_gcu", [&] {
    RmsNormRows<data_t, data_t>(x.data<data_t>(), weight.data<data_t>(), standin::Mutable<data_t>(out), rows,
                                hidden, epsilon);
  });
#endif
  return {out};
}

std::vector<std::vector<int64_t>> RmsNormGcuShape(const std::vector<int64_t>& x, const std::vector<int64_t>&) {
  return {x};
}
std::vector<paddle::DataType> RmsNormGcuDtype(const paddle::DataType&, const paddle::DataType& w) { return {w}; }

PD_BUILD_OP(rms_norm_gcu)
    .Inputs({"x", "weight"})
    .Outputs({"out"})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(RmsNormGcu))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormGcuShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormGcuDtype));

// residual_out = x + residual (rounded to the dtype, as a composed add would); out = RMSNorm(residual_out).
std::vector<paddle::Tensor> FusedAddRmsNorm(const paddle::Tensor& x, const paddle::Tensor& residual,
                                            const paddle::Tensor& weight, float epsilon) {
  standin::LogCall("fused_add_rms_norm_op", x);
  CheckNormOperands("fused_add_rms_norm_op", x, weight);
  PD_CHECK(x.shape() == residual.shape() && x.dtype() == residual.dtype(), "fused_add_rms_norm_op: x ", Shape(x),
           " and residual ", Shape(residual), " must have the same shape and dtype");
  paddle::Tensor out = standin::Empty(x.shape(), weight.dtype(), x.place());
  paddle::Tensor res_out = standin::Empty(residual.shape(), weight.dtype(), x.place());
  const int64_t hidden = Dim(x, -1);
  const int64_t rows = hidden ? x.numel() / hidden : 0;
  STANDIN_DISPATCH_FLOAT(x.dtype(), "fused_add_rms_norm_op", [&] {
    const data_t* a = x.data<data_t>();
    const data_t* b = residual.data<data_t>();
    data_t* r = standin::Mutable<data_t>(res_out);
    for (int64_t i = 0; i < x.numel(); ++i) r[i] = static_cast<data_t>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
    RmsNormRows<data_t, data_t>(r, weight.data<data_t>(), standin::Mutable<data_t>(out), rows, hidden, epsilon);
  });
  return {out, res_out};
}

std::vector<std::vector<int64_t>> FusedAddRmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>& r,
                                                       const std::vector<int64_t>&) {
  return {x, r};
}
std::vector<paddle::DataType> FusedAddRmsNormDtype(const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType& w) {
  return {w, w};
}

PD_BUILD_OP(fused_add_rms_norm_op)
    .Inputs({"x", "residual", "weight"})
    .Outputs({"out", "residual_out"})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(FusedAddRmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(FusedAddRmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FusedAddRmsNormDtype));

// ------------------------------------------------------------------------------ rotary
// vLLM's rotary_embedding (what topsvllmRotaryEmbedding implements): row p of cos_sin_table is
// [cos(p*f_0..f_{r/2-1}) | sin(...)], r = table width <= head_dim (only the first r dims of each
// head rotate). is_neox: rotate halves (x[i], x[i + r/2]); else GPT-J pairs (x[2i], x[2i+1]).
template <typename T>
static void RotateHeads(T* x, int64_t tokens, int64_t heads, int64_t head_dim, const T* table, int64_t rot,
                        const std::vector<int64_t>& pos, bool is_neox) {
  const int64_t half = rot / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const T* cs = table + pos[t] * rot;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t i1 = is_neox ? i : 2 * i;
        const int64_t i2 = is_neox ? i + half : 2 * i + 1;
        const float c = static_cast<float>(cs[i]), s = static_cast<float>(cs[half + i]);
        const float a = static_cast<float>(v[i1]), b = static_cast<float>(v[i2]);
        v[i1] = static_cast<T>(a * c - b * s);
        v[i2] = static_cast<T>(b * c + a * s);
      }
    }
  }
}

// Real op (fused_rotary_embedding_op.cc + custom_op_common.cc): query [B, S, H, D] and key
// [B, S, Hk, D] rank 4, cos_sin_table rank 2, positions rank 2 [B, S]; rotates query and key in
// place and returns them (no in-place map is declared).
std::vector<paddle::Tensor> FusedRotaryEmbedding(const paddle::Tensor& query, const paddle::Tensor& key,
                                                 const paddle::Tensor& cos_sin_table, const paddle::Tensor& positions,
                                                 bool is_neox) {
  standin::LogCall("fused_rotary_embedding_gcu", query);
  const char* op = "fused_rotary_embedding_gcu";
  PD_CHECK(query.shape().size() == 4 && key.shape().size() == 4, op, ": query ", Shape(query), " and key ",
           Shape(key), " must be rank 4 [batch, seq, heads, head_dim]");
  PD_CHECK(cos_sin_table.shape().size() == 2 && positions.shape().size() == 2, op, ": cos_sin_table ",
           Shape(cos_sin_table), " and positions ", Shape(positions), " must be rank 2");
  const int64_t tokens = Dim(query, 0) * Dim(query, 1), head_dim = Dim(query, 3);
  const int64_t rot = Dim(cos_sin_table, 1), max_pos = Dim(cos_sin_table, 0);
  PD_CHECK(Dim(key, 0) * Dim(key, 1) == tokens && Dim(key, 3) == head_dim && positions.numel() == tokens, op,
           ": query ", Shape(query), ", key ", Shape(key), ", positions ", Shape(positions), " disagree on tokens");
  PD_CHECK(rot % 2 == 0 && rot <= head_dim, op, ": cos_sin_table width ", rot, " must be even and <= head_dim ",
           head_dim);
  PD_CHECK(query.dtype() == key.dtype() && query.dtype() == cos_sin_table.dtype(), op,
           ": query, key and cos_sin_table must share one dtype");
  const std::vector<int64_t> pos = standin::Ints(positions, "positions");
  for (int64_t p : pos) PD_CHECK(p >= 0 && p < max_pos, op, ": position ", p, " outside the table's ", max_pos, " rows");
  STANDIN_DISPATCH_FLOAT(query.dtype(), op, [&] {
    const data_t* table = cos_sin_table.data<data_t>();
    RotateHeads(standin::Mutable<data_t>(query), tokens, Dim(query, 2), head_dim, table, rot, pos, is_neox);
    RotateHeads(standin::Mutable<data_t>(key), tokens, Dim(key, 2), head_dim, table, rot, pos, is_neox);
  });
  return {query, key};
}

std::vector<std::vector<int64_t>> FusedRotaryEmbeddingShape(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                                            const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                            bool) {
  return {q, k};
}

PD_BUILD_OP(fused_rotary_embedding_gcu)
    .Inputs({"query", "key", "cos_sin_table", "positions"})
    .Outputs({"query_out", "key_out"})
    .Attrs({"is_neox: bool"})
    .SetKernelFn(PD_KERNEL(FusedRotaryEmbedding))
    .SetInferShapeFn(PD_INFER_SHAPE(FusedRotaryEmbeddingShape));

// ------------------------------------------------------------------------------ KV write
// The real op declares Inputs (key, value, key_cache, value_cache, slot_mapping) but its kernel
// function's parameters are (key_cache, value_cache, key, value, slot_mapping), and Paddle binds
// inputs to parameters by position: the real kernel writes into the FIRST two inputs. So a caller
// must pass (key_cache, value_cache, key, value, slot_mapping); the stand-in does what the real
// kernel does with that order and refuses the declared-name order (which would break on a GCU).
// Caches [num_blocks, block_size, kv_heads, D]; key/value [T, kv_heads, D] or [T, kv_heads*D];
// slot_mapping [T] int32 / int64, slot = block * block_size + offset, negative = skip (vLLM).
void ReshapeAndCacheFlash(const paddle::Tensor& key_cache, const paddle::Tensor& value_cache,
                          const paddle::Tensor& key, const paddle::Tensor& value, const paddle::Tensor& slot_mapping) {
  standin::LogCall("reshape_and_cache_flash_gcu", key_cache);
  const char* op = "reshape_and_cache_flash_gcu";
  PD_CHECK(key_cache.shape().size() == 4 && value_cache.shape() == key_cache.shape(), op,
           ": inputs 0 and 1 must be the caches [num_blocks, block_size, kv_heads, head_dim] (the real kernel's "
           "parameter order is key_cache, value_cache, key, value, slot_mapping), got ",
           Shape(key_cache), " and ", Shape(value_cache));
  PD_CHECK(key.shape() == value.shape(), op, ": key ", Shape(key), " and value ", Shape(value), " differ");
  const int64_t slots = Dim(key_cache, 0) * Dim(key_cache, 1), row = Dim(key_cache, 2) * Dim(key_cache, 3);
  const int64_t tokens = key.shape().empty() ? 0 : Dim(key, 0);
  PD_CHECK(tokens * row == key.numel(), op, ": key ", Shape(key), " is not [tokens, kv_heads, head_dim] of cache ",
           Shape(key_cache));
  PD_CHECK(slot_mapping.numel() == tokens, op, ": slot_mapping has ", slot_mapping.numel(), " entries for ", tokens,
           " tokens");
  PD_CHECK(key.dtype() == key_cache.dtype() && value.dtype() == value_cache.dtype(), op,
           ": key/value and cache dtypes differ");
  const std::vector<int64_t> slot = standin::Ints(slot_mapping, "slot_mapping");
  STANDIN_DISPATCH_FLOAT(key.dtype(), op, [&] {
    data_t* kc = standin::Mutable<data_t>(key_cache);
    data_t* vc = standin::Mutable<data_t>(value_cache);
    const data_t* k = key.data<data_t>();
    const data_t* v = value.data<data_t>();
    for (int64_t t = 0; t < tokens; ++t) {
      if (slot[t] < 0) continue;
      PD_CHECK(slot[t] < slots, op, ": slot ", slot[t], " outside the cache's ", slots, " slots");
      std::copy(k + t * row, k + (t + 1) * row, kc + slot[t] * row);
      std::copy(v + t * row, v + (t + 1) * row, vc + slot[t] * row);
    }
  });
}

PD_BUILD_OP(reshape_and_cache_flash_gcu)
    .Inputs({"key", "value", "key_cache", "value_cache", "slot_mapping"})
    .Outputs({"key_cache_out", "value_cache_out"})
    .SetInplaceMap({{"key_cache", "key_cache_out"}, {"value_cache", "value_cache_out"}})
    .SetKernelFn(PD_KERNEL(ReshapeAndCacheFlash));
