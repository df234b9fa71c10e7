// Stand-in reference kernels of paddle-custom-gcu's weight-only linear and MoE custom ops (tests
// only; NOT an Enflame GCU): linear_quant_gcu, topk_softmax_gcu, moe_align_block_size_gcu,
// fused_moe_kernel_gcu. Signatures are those of PaddleCustomDevice backends/gcu/custom_op/llm
// (PD_BUILD_OP). The MoE trio follows vLLM's ops of the same names (topsvllm implements them):
// like the real ops, they write into their first input tensors and return tensors over the same
// memory (no in-place map is declared).

#include <algorithm>
#include <limits>
#include <numeric>

#include "standin_ops.h"

using standin::Dim;
using standin::Shape;

namespace {

// ------------------------------------------------------------------------------ weight-only linear
// Layouts (what paddle-custom-gcu's weight_quantize_rtn hands linear_quant_gcu for x = W [K, N]):
//   int8 ("weight_only_int8" -> Paddle's "llm.int8"): rhs int8 [N, K], w[n, k] = q * scale.
//   int4 ("weight_only_int4"): the gcu weight_quantize kernel stores u = clip(round(w / s), -7, 7) + 8
//     (4 unsigned bits), then rearrange_for_w4a16 pads K to Kp = ceil(K / 128) * 128 and packs
//     along K in 128-wide chunks: byte [n, 64 c + i] = u[n, 128 c + i] | u[n, 128 c + 64 + i] << 4
//     (i < 64); rhs uint8 [N, Kp / 2]; w[n, k] = (u - 8) * scale.
//   The stand-in tells the two apart by rhs dtype (int8 vs uint8): how the TopsAten kernel does is
//   not public.
//   scale: group_size -1: [N]; group_size g (64 or 128): [ceil(K / g), N], row k / g. fp32 or lhs dtype.
//   Output: lhs [..., K] -> [..., N] in lhs dtype; bias [N] optional.
// The real op sizes its output with `lhs K == rhs.shape[0] ? rhs.shape[-1] : rhs.shape[0]`; for a
// packed int4 weight with N == K that gives Kp / 2, not N: the stand-in refuses that case.
struct QuantWeight {
  int64_t n, k, kp;
  bool int4;
  int64_t group;  // -1: per channel
  std::vector<float> scale;
  const int8_t* q8 = nullptr;
  const uint8_t* q4 = nullptr;

  double At(int64_t row, int64_t col) const {
    const float s = scale[(group < 0 ? 0 : col / group) * n + row];
    if (!int4) return static_cast<double>(q8[row * k + col]) * s;
    const int64_t chunk = col / 128, r = col % 128;
    const uint8_t byte = q4[row * (kp / 2) + chunk * 64 + (r < 64 ? r : r - 64)];
    const int u = r < 64 ? (byte & 0x0F) : (byte >> 4);
    return static_cast<double>(u - 8) * s;
  }
};

std::vector<float> ScaleValues(const paddle::Tensor& scale) {
  std::vector<float> s(static_cast<size_t>(scale.numel()));
  STANDIN_DISPATCH_FLOAT(scale.dtype(), "linear_quant_gcu scale", [&] {
    const data_t* p = scale.data<data_t>();
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(p[i]);
  });
  return s;
}

QuantWeight MakeQuantWeight(const paddle::Tensor& lhs, const paddle::Tensor& rhs, const paddle::Tensor& scale,
                            int group_size) {
  const char* op = "linear_quant_gcu";
  QuantWeight w{};
  w.k = Dim(lhs, -1);
  PD_CHECK(rhs.shape().size() == 2, op, ": rhs ", Shape(rhs), " must be 2-D");
  w.int4 = rhs.dtype() == paddle::DataType::UINT8;
  PD_CHECK(w.int4 || rhs.dtype() == paddle::DataType::INT8, op, ": rhs must be int8 (int8 weights) or uint8 "
           "(packed int4), got ", phi::DataTypeToString(rhs.dtype()));
  w.n = Dim(rhs, 0);
  w.kp = (w.k + 127) / 128 * 128;
  PD_CHECK(Dim(rhs, 1) == (w.int4 ? w.kp / 2 : w.k), op, ": rhs ", Shape(rhs), " is not ",
           w.int4 ? "packed int4 [N, ceil(K/128)*128/2]" : "int8 [N, K]", " for lhs K = ", w.k);
  PD_CHECK(!(w.int4 && w.k == w.n && w.kp / 2 != w.n), op, ": packed int4 rhs ", Shape(rhs), " with N == K = ", w.k,
           ": the real op would size its output rhs.shape[-1] = ", w.kp / 2, " (lhs K == rhs.shape[0])");
  PD_CHECK(group_size == -1 || group_size == 64 || group_size == 128, op, ": group_size must be -1, 64 or 128, got ",
           group_size);
  w.group = group_size;
  const int64_t groups = group_size < 0 ? 1 : (w.k + group_size - 1) / group_size;
  PD_CHECK(scale.numel() == groups * w.n && (group_size < 0 ? scale.shape().size() == 1 : scale.shape().size() == 2),
           op, ": scale ", Shape(scale), " must be ", group_size < 0 ? "[N]" : "[ceil(K/group_size), N]", ", N = ", w.n);
  w.scale = ScaleValues(scale);
  if (w.int4) w.q4 = rhs.data<uint8_t>();
  else w.q8 = rhs.data<int8_t>();
  return w;
}

}  // namespace

std::vector<paddle::Tensor> LinearQuant(const paddle::Tensor& lhs, const paddle::Tensor& rhs,
                                        const paddle::Tensor& scale, const paddle::optional<paddle::Tensor>& bias,
                                        int group_size) {
  standin::LogCall("linear_quant_gcu", lhs);
  const QuantWeight w = MakeQuantWeight(lhs, rhs, scale, group_size);
  std::vector<int64_t> out_shape = lhs.shape();
  out_shape.back() = w.n;
  paddle::Tensor out = standin::Empty(out_shape, lhs.dtype(), lhs.place());
  const int64_t rows = w.k ? lhs.numel() / w.k : 0;
  PD_CHECK(!bias || (bias->numel() == w.n && bias->dtype() == lhs.dtype()), "linear_quant_gcu: bias must be [N] of "
           "lhs dtype");
  STANDIN_DISPATCH_FLOAT(lhs.dtype(), "linear_quant_gcu", [&] {
    const data_t* x = lhs.data<data_t>();
    const data_t* b = bias ? bias->data<data_t>() : nullptr;
    data_t* o = standin::Mutable<data_t>(out);
    std::vector<double> wrow(static_cast<size_t>(w.k));
    for (int64_t n = 0; n < w.n; ++n) {
      for (int64_t k = 0; k < w.k; ++k) wrow[k] = w.At(n, k);
      for (int64_t m = 0; m < rows; ++m) {
        double acc = b ? static_cast<float>(b[n]) : 0.0;
        for (int64_t k = 0; k < w.k; ++k) acc += static_cast<float>(x[m * w.k + k]) * wrow[k];
        o[m * w.n + n] = static_cast<data_t>(static_cast<float>(acc));
      }
    }
  });
  return {out};
}

std::vector<std::vector<int64_t>> LinearQuantShape(const std::vector<int64_t>& lhs, const std::vector<int64_t>& rhs,
                                                   const std::vector<int64_t>&,
                                                   const paddle::optional<std::vector<int64_t>>&) {
  std::vector<int64_t> out = lhs;  // the real op's rule (see above)
  out.back() = lhs.back() == rhs.front() ? rhs.back() : rhs.front();
  return {out};
}
std::vector<paddle::DataType> LinearQuantDtype(const paddle::DataType& lhs, const paddle::DataType&,
                                               const paddle::DataType&, const paddle::optional<paddle::DataType>&) {
  return {lhs};
}

PD_BUILD_OP(linear_quant_gcu)
    .Inputs({"lhs", "rhs", "scale", paddle::Optional("bias")})
    .Outputs({"linear_out"})
    .Attrs({"group_size: int"})
    .SetKernelFn(PD_KERNEL(LinearQuant))
    .SetInferShapeFn(PD_INFER_SHAPE(LinearQuantShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LinearQuantDtype));

// ------------------------------------------------------------------------------ MoE routing
// vLLM topk_softmax: softmax over the E experts of each token (fp32), the k largest in descending
// order (ties: the lower expert first); norm_topk_prob renormalises the k weights to sum 1;
// token_expert_indices[t, j] = j * T + t. Writes into the three given [T, k] tensors.
std::vector<paddle::Tensor> TopkSoftmax(const paddle::Tensor& topk_weights, const paddle::Tensor& topk_indices,
                                        const paddle::Tensor& token_expert_indices,
                                        const paddle::Tensor& gating_output, bool norm_topk_prob) {
  standin::LogCall("topk_softmax_gcu", topk_weights);
  const char* op = "topk_softmax_gcu";
  PD_CHECK(gating_output.shape().size() == 2 && topk_weights.shape().size() == 2, op, ": gating_output ",
           Shape(gating_output), " must be [T, E] and topk_weights ", Shape(topk_weights), " [T, k]");
  const int64_t T = Dim(gating_output, 0), E = Dim(gating_output, 1), k = Dim(topk_weights, 1);
  PD_CHECK(Dim(topk_weights, 0) == T && k <= E && topk_indices.shape() == topk_weights.shape() &&
               token_expert_indices.shape() == topk_weights.shape(),
           op, ": outputs must be [T, k] with k <= E, got ", Shape(topk_weights));
  PD_CHECK(topk_indices.dtype() == paddle::DataType::INT32 && token_expert_indices.dtype() == paddle::DataType::INT32,
           op, ": topk_indices and token_expert_indices must be int32");
  std::vector<double> p(static_cast<size_t>(E));
  std::vector<int64_t> order(static_cast<size_t>(E));
  int32_t* idx = standin::Mutable<int32_t>(topk_indices);
  int32_t* src = standin::Mutable<int32_t>(token_expert_indices);
  for (int64_t t = 0; t < T; ++t) {
    STANDIN_DISPATCH_FLOAT(gating_output.dtype(), op, [&] {
      const data_t* g = gating_output.data<data_t>() + t * E;
      for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(g[e]);
    });
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0.0;
    for (double& x : p) sum += (x = std::exp(x - mx));
    for (double& x : p) x /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double kept = 0.0;
    for (int64_t j = 0; j < k; ++j) kept += p[order[j]];
    STANDIN_DISPATCH_FLOAT(topk_weights.dtype(), op, [&] {
      data_t* w = standin::Mutable<data_t>(topk_weights) + t * k;
      for (int64_t j = 0; j < k; ++j) w[j] = static_cast<data_t>(static_cast<float>(p[order[j]] / (norm_topk_prob ? kept : 1.0)));
    });
    for (int64_t j = 0; j < k; ++j) {
      idx[t * k + j] = static_cast<int32_t>(order[j]);
      src[t * k + j] = static_cast<int32_t>(j * T + t);
    }
  }
  return {standin::Alias(topk_weights), standin::Alias(topk_indices), standin::Alias(token_expert_indices)};
}

std::vector<std::vector<int64_t>> TopkSoftmaxShape(const std::vector<int64_t>& w, const std::vector<int64_t>& i,
                                                   const std::vector<int64_t>& s, const std::vector<int64_t>&) {
  return {w, i, s};
}
std::vector<paddle::DataType> TopkSoftmaxDtype(const paddle::DataType& w, const paddle::DataType& i,
                                               const paddle::DataType& s, const paddle::DataType&) {
  return {w, i, s};
}

PD_BUILD_OP(topk_softmax_gcu)
    .Inputs({"topk_weights", "topk_indices", "token_expert_indices", "gating_output"})
    .Outputs({"topk_weights_out", "topk_indices_out", "token_expert_indices_out"})
    .Attrs({"norm_topk_prob: bool"})
    .SetKernelFn(PD_KERNEL(TopkSoftmax))
    .SetInferShapeFn(PD_INFER_SHAPE(TopkSoftmaxShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TopkSoftmaxDtype));

// vLLM moe_align_block_size: with c_e = how many of the N = T*k entries of topk_ids (flattened,
// int32) pick expert e, expert e owns the padded range [off_e, off_e + ceil(c_e / B) * B) of
// sorted_token_ids (off = exclusive prefix sum), holding its flat indices i in increasing order,
// the rest of the range the sentinel N; every slot of sorted_token_ids past the ranges is N too
// (the caller passes an uninitialised buffer). experts_ids[b] = the expert of block b for
// b < total / B (later entries untouched); num_tokens_post_pad[0] = total. Ids outside [0, E) are
// ignored. Capacity: sorted_token_ids >= total, experts_ids >= total / B (else it raises).
std::vector<paddle::Tensor> MoeAlignBlockSize(const paddle::Tensor& sorted_token_ids, const paddle::Tensor& experts_ids,
                                              const paddle::Tensor& num_tokens_post_pad, const paddle::Tensor& topk_ids,
                                              int num_experts, int block_size) {
  standin::LogCall("moe_align_block_size_gcu", sorted_token_ids);
  const char* op = "moe_align_block_size_gcu";
  for (const paddle::Tensor* x : {&sorted_token_ids, &experts_ids, &num_tokens_post_pad, &topk_ids})
    PD_CHECK(x->dtype() == paddle::DataType::INT32, op, ": every tensor must be int32");
  PD_CHECK(num_experts > 0 && block_size > 0 && num_tokens_post_pad.numel() >= 1, op, ": bad arguments");
  const int64_t n = topk_ids.numel(), E = num_experts, B = block_size;
  const int32_t* ids = topk_ids.data<int32_t>();
  std::vector<int64_t> count(static_cast<size_t>(E), 0), off(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && ids[i] < E) ++count[ids[i]];
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + (count[e] + B - 1) / B * B;
  const int64_t total = off[E];
  PD_CHECK(sorted_token_ids.numel() >= total && experts_ids.numel() >= total / B, op, ": buffers too small: ",
           total, " padded entries / ", total / B, " blocks, sorted_token_ids ", sorted_token_ids.numel(),
           ", experts_ids ", experts_ids.numel());
  int32_t* sorted = standin::Mutable<int32_t>(sorted_token_ids);
  int32_t* blocks = standin::Mutable<int32_t>(experts_ids);
  std::fill(sorted, sorted + sorted_token_ids.numel(), static_cast<int32_t>(n));
  std::vector<int64_t> fill(off.begin(), off.end() - 1);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && ids[i] < E) sorted[fill[ids[i]]++] = static_cast<int32_t>(i);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t b = off[e] / B; b < off[e + 1] / B; ++b) blocks[b] = static_cast<int32_t>(e);
  standin::Mutable<int32_t>(num_tokens_post_pad)[0] = static_cast<int32_t>(total);
  return {standin::Alias(sorted_token_ids), standin::Alias(experts_ids), standin::Alias(num_tokens_post_pad)};
}

std::vector<std::vector<int64_t>> MoeAlignShape(const std::vector<int64_t>& s, const std::vector<int64_t>& e,
                                                const std::vector<int64_t>& n, const std::vector<int64_t>&, int, int) {
  return {s, e, n};
}
std::vector<paddle::DataType> MoeAlignDtype(const paddle::DataType& s, const paddle::DataType& e,
                                            const paddle::DataType& n, const paddle::DataType&, int, int) {
  return {s, e, n};
}

PD_BUILD_OP(moe_align_block_size_gcu)
    .Inputs({"sorted_token_ids", "experts_ids", "num_tokens_post_pad", "topk_ids"})
    .Outputs({"sorted_token_ids_out", "experts_ids_out", "num_tokens_post_pad_out"})
    .Attrs({"num_experts: int", "block_size: int"})
    .SetKernelFn(PD_KERNEL(MoeAlignBlockSize))
    .SetInferShapeFn(PD_INFER_SHAPE(MoeAlignShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MoeAlignDtype));

// ------------------------------------------------------------------------------ expert GEMM
// vLLM fused_moe_kernel (the topsvllm op the real one calls), one padded slot p < num_tokens_post_pad
// at a time: tok = sorted_token_ids[p]; tok >= N (= topk_ids.numel(), the sentinel) is skipped;
// e = experts_ids[p / block_size] (e = -1: the row is zeros, as vLLM's expert-parallel convention);
// C[tok, :] = A[tok / topk, :] @ B[e]^T (+ bias[e]) (* topk_weights.flat[tok] if mul_routed_weight).
// A [M, K], B [E, N, K], C [..., N] viewed as [N_pairs, N] (FastDeploy: [T, k, N]), bias [E, N].
// C is written in place (rows no slot names keep their contents) and returned.
std::vector<paddle::Tensor> FusedMoeKernel(const paddle::Tensor& C, const paddle::Tensor& A, const paddle::Tensor& B,
                                           const paddle::optional<paddle::Tensor>& bias,
                                           const paddle::Tensor& topk_weights, const paddle::Tensor& topk_ids,
                                           const paddle::Tensor& sorted_token_ids, const paddle::Tensor& experts_ids,
                                           const paddle::Tensor& num_tokens_post_pad, bool mul_routed_weight,
                                           int64_t topk, int64_t block_size) {
  standin::LogCall("fused_moe_kernel_gcu", C);
  const char* op = "fused_moe_kernel_gcu";
  PD_CHECK(A.shape().size() == 2 && B.shape().size() == 3 && Dim(B, 2) == Dim(A, 1), op, ": A ", Shape(A),
           " must be [M, K] and B ", Shape(B), " [E, N, K]");
  const int64_t K = Dim(A, 1), N = Dim(B, 1), E = Dim(B, 0), pairs = topk_ids.numel();
  PD_CHECK(topk > 0 && block_size > 0 && Dim(A, 0) * topk == pairs && C.numel() == pairs * N, op, ": C ", Shape(C),
           " must hold topk_ids.numel() = ", pairs, " rows of N = ", N, " and A ", Shape(A), " rows * topk ", topk,
           " = ", pairs);
  PD_CHECK(A.dtype() == B.dtype() && C.dtype() == A.dtype(), op, ": A, B and C must share one dtype");
  PD_CHECK(!bias || bias->numel() == E * N, op, ": bias must be [E, N]");
  const std::vector<int64_t> sorted = standin::Ints(sorted_token_ids, "sorted_token_ids");
  const std::vector<int64_t> blocks = standin::Ints(experts_ids, "experts_ids");
  const int64_t total = standin::Ints(num_tokens_post_pad, "num_tokens_post_pad").at(0);
  PD_CHECK(total <= static_cast<int64_t>(sorted.size()) && (total + block_size - 1) / block_size <=
           static_cast<int64_t>(blocks.size()), op, ": num_tokens_post_pad ", total, " exceeds the buffers");
  std::vector<float> rw(static_cast<size_t>(topk_weights.numel()));
  STANDIN_DISPATCH_FLOAT(topk_weights.dtype(), op, [&] {
    for (size_t i = 0; i < rw.size(); ++i) rw[i] = static_cast<float>(topk_weights.data<data_t>()[i]);
  });
  PD_CHECK(!mul_routed_weight || static_cast<int64_t>(rw.size()) == pairs, op, ": topk_weights must have ", pairs,
           " entries");
  STANDIN_DISPATCH_FLOAT(A.dtype(), op, [&] {
    const data_t *a = A.data<data_t>(), *b = B.data<data_t>(), *bi = bias ? bias->data<data_t>() : nullptr;
    data_t* c = standin::Mutable<data_t>(C);
    for (int64_t p = 0; p < total; ++p) {
      const int64_t tok = sorted[p], e = blocks[p / block_size];
      if (tok < 0 || tok >= pairs) continue;
      PD_CHECK(e >= -1 && e < E, op, ": experts_ids[", p / block_size, "] = ", e, " outside [-1, ", E, ")");
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0.0;
        for (int64_t k = 0; e >= 0 && k < K; ++k)
          acc += static_cast<double>(static_cast<float>(a[(tok / topk) * K + k])) * static_cast<float>(b[(e * N + n) * K + k]);
        if (e >= 0 && bi) acc += static_cast<float>(bi[e * N + n]);
        if (e >= 0 && mul_routed_weight) acc *= rw[tok];
        c[tok * N + n] = static_cast<data_t>(static_cast<float>(acc));
      }
    }
  });
  return {standin::Alias(C)};
}

std::vector<std::vector<int64_t>> FusedMoeShape(const std::vector<int64_t>& c, const std::vector<int64_t>&,
                                                const std::vector<int64_t>&,
                                                const paddle::optional<std::vector<int64_t>>&,
                                                const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                const std::vector<int64_t>&, bool, int64_t, int64_t) {
  return {c};
}
std::vector<paddle::DataType> FusedMoeDtype(const paddle::DataType& c, const paddle::DataType&,
                                            const paddle::DataType&, const paddle::optional<paddle::DataType>&,
                                            const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
                                            const paddle::DataType&, const paddle::DataType&, bool, int64_t, int64_t) {
  return {c};
}

PD_BUILD_OP(fused_moe_kernel_gcu)
    .Inputs({"C", "A", "B", paddle::Optional("bias"), "topk_weights", "topk_ids", "sorted_token_ids", "experts_ids",
             "num_tokens_post_pad"})
    .Outputs({"C_out"})
    .Attrs({"mul_routed_weight: bool", "topk: int64_t", "block_size: int64_t"})
    .SetKernelFn(PD_KERNEL(FusedMoeKernel))
    .SetInferShapeFn(PD_INFER_SHAPE(FusedMoeShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FusedMoeDtype));
