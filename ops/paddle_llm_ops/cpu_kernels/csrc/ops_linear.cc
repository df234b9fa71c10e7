// Paddle op registrations of the linear kernels: the fp32, int8 weight-only, int8 x int8 and int4
// GEMVs, the int8 group dot products, and the int8 quantizers (the activation and the weight ones).
// Shared checks: ops_common.h.
#include <string>
#include <vector>

#include "ops_common.h"

namespace {

using namespace plk_ops;

// ------------------------------------------------------------------------------------------ GEMV
std::vector<Tensor> Gemv(const Tensor& x, const Tensor& w, const paddle::optional<Tensor>& bias,
                         const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(x, "x", DataType::FLOAT32, 2);
  check_tensor(w, "w", DataType::FLOAT32, 2);
  const int64_t B = x.shape()[0], K = x.shape()[1], N = w.shape()[0];
  PD_CHECK(w.shape()[1] == K, "w must be [N, K] with K = x.shape[1] = ", K, ", got [", N, ", ", w.shape()[1], "]");
  const float* b = optional_vector(bias, "bias", N);
  Tensor y = paddle::empty({B, N}, DataType::FLOAT32, paddle::CPUPlace());
  plk::gemv_f32(i, x.data<float>(), w.data<float>(), b, y.data<float>(), B, N, K);
  return {y};
}

std::vector<Tensor> GemmF32(const Tensor& x, const Tensor& w, const paddle::optional<Tensor>& bias,
                            const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  PD_CHECK(i == plk::Isa::kAvx512Vnni, "the fp32 GEMM is AVX-512 code: isa must be avx512_vnni, got '", isa, "'");
  check_tensor(x, "x", DataType::FLOAT32, 2);
  check_tensor(w, "w", DataType::FLOAT32, 2);
  const int64_t B = x.shape()[0], K = x.shape()[1], N = w.shape()[0];
  PD_CHECK(w.shape()[1] == K, "w must be [N, K] with K = x.shape[1] = ", K, ", got [", N, ", ", w.shape()[1], "]");
  const float* b = optional_vector(bias, "bias", N);
  Tensor y = paddle::empty({B, N}, DataType::FLOAT32, paddle::CPUPlace());
  plk::gemm_f32_avx512(x.data<float>(), w.data<float>(), b, y.data<float>(), B, N, K);
  return {y};
}

std::vector<Tensor> GemvInt8(const Tensor& x, const Tensor& q, const Tensor& scale,
                             const paddle::optional<Tensor>& bias, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(x, "x", DataType::FLOAT32, 2);
  check_tensor(q, "q", DataType::INT8, 2);
  check_tensor(scale, "scale", DataType::FLOAT32, 1);
  const int64_t B = x.shape()[0], K = x.shape()[1], N = q.shape()[0];
  PD_CHECK(q.shape()[1] == K, "q must be [N, K] with K = x.shape[1] = ", K, ", got [", N, ", ", q.shape()[1], "]");
  PD_CHECK(scale.shape()[0] == N, "scale must be [N] with N = ", N, ", got [", scale.shape()[0], "]");
  const float* b = optional_vector(bias, "bias", N);
  Tensor y = paddle::empty({B, N}, DataType::FLOAT32, paddle::CPUPlace());
  plk::gemv_int8(i, x.data<float>(), q.data<int8_t>(), scale.data<float>(), b, y.data<float>(), B, N, K);
  return {y};
}

// Activation group size: 0 or K = per row; else a multiple of 32 (the AVX2 path steps whole
// 32-byte blocks inside a group). int32 exactness: 255 * 127 * G < 2^31 needs G <= 65536.
int64_t check_group(int64_t group, int64_t K) {
  const int64_t G = (group <= 0 || group >= K) ? K : group;
  PD_CHECK(K >= 1, "K must be positive");
  PD_CHECK(G == K || G % 32 == 0, "activation group ", group, " must be 0 (per row) or a multiple of 32");
  PD_CHECK(G <= 65536, "activation group of ", G, " input channels exceeds 65536 (int32 accumulators)");
  return G;
}

std::vector<Tensor> GemvW8A8(const Tensor& x, const Tensor& q, const Tensor& scale,
                             const paddle::optional<Tensor>& bias, int group, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(x, "x", DataType::FLOAT32, 2);
  check_tensor(q, "q", DataType::INT8, 2);
  check_tensor(scale, "scale", DataType::FLOAT32, 1);
  const int64_t B = x.shape()[0], K = x.shape()[1], N = q.shape()[0];
  PD_CHECK(q.shape()[1] == K, "q must be [N, K] with K = x.shape[1] = ", K, ", got [", N, ", ", q.shape()[1], "]");
  PD_CHECK(scale.shape()[0] == N, "scale must be [N] with N = ", N, ", got [", scale.shape()[0], "]");
  const int64_t G = check_group(group, K);
  const float* b = optional_vector(bias, "bias", N);
  Tensor y = paddle::empty({B, N}, DataType::FLOAT32, paddle::CPUPlace());
  plk::gemv_w8a8(i, x.data<float>(), q.data<int8_t>(), scale.data<float>(), b, y.data<float>(), B, N, K, G);
  return {y};
}

std::vector<Tensor> Int8DotGroups(const Tensor& xq, const Tensor& q, int group, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(xq, "xq", DataType::INT8, 2);
  check_tensor(q, "q", DataType::INT8, 2);
  const int64_t B = xq.shape()[0], K = xq.shape()[1], N = q.shape()[0];
  PD_CHECK(q.shape()[1] == K, "q must be [N, K] with K = xq.shape[1] = ", K, ", got [", N, ", ", q.shape()[1], "]");
  const int64_t G = check_group(group, K);
  const int8_t* xp = xq.data<int8_t>();
  const int8_t* qp = q.data<int8_t>();
  for (int64_t j = 0; j < B * K; ++j) PD_CHECK(xp[j] != -128, "xq must lie in [-127, 127]");
  for (int64_t j = 0; j < N * K; ++j) PD_CHECK(qp[j] != -128, "q must lie in [-127, 127]");
  Tensor acc = paddle::empty({B, N, (K + G - 1) / G}, DataType::INT32, paddle::CPUPlace());
  plk::int8_dot_groups(i, xp, qp, acc.data<int32_t>(), B, N, K, G);
  return {acc};
}

std::vector<Tensor> QuantizeActInt8(const Tensor& x, int group) {
  check_tensor(x, "x", DataType::FLOAT32, 2);
  const int64_t B = x.shape()[0], K = x.shape()[1];
  const int64_t G = check_group(group, K);
  Tensor xq = paddle::empty({B, K}, DataType::INT8, paddle::CPUPlace());
  Tensor xs = paddle::empty({B, (K + G - 1) / G}, DataType::FLOAT32, paddle::CPUPlace());
  plk::quantize_activations_int8(x.data<float>(), xq.data<int8_t>(), xs.data<float>(), B, K, K, G);
  return {xq, xs};
}

std::vector<Tensor> QuantizeInt8(const Tensor& w) {
  check_tensor(w, "w", DataType::FLOAT32, 2);
  const int64_t N = w.shape()[0], K = w.shape()[1];
  Tensor q = paddle::empty({N, K}, DataType::INT8, paddle::CPUPlace());
  Tensor s = paddle::empty({N}, DataType::FLOAT32, paddle::CPUPlace());
  plk::quantize_int8_rows(w.data<float>(), q.data<int8_t>(), s.data<float>(), N, K);
  return {q, s};
}

// int4: q [N, ceil(K/2)] uint8, scale [N, groups] fp32 with K % groups == 0 and the group size
// K / groups a multiple of 8 unless groups == 1 (one scale per 8-weight vector step).
int64_t check_int4(const Tensor& q, const Tensor& scale, int64_t K) {
  check_tensor(q, "q", DataType::UINT8, 2);
  check_tensor(scale, "scale", DataType::FLOAT32, 2);
  const int64_t N = q.shape()[0], groups = scale.shape()[1];
  PD_CHECK(K > 0 && q.shape()[1] == (K + 1) / 2, "q must be [N, ceil(K / 2)] with K = ", K, ", got [", N, ", ",
           q.shape()[1], "]");
  PD_CHECK(scale.shape()[0] == N && groups >= 1, "scale must be [N = ", N, ", groups], got [", scale.shape()[0], ", ",
           groups, "]");
  PD_CHECK(K % groups == 0 && (groups == 1 || (K / groups) % 8 == 0), "K = ", K, " must split into ", groups,
           " groups of a multiple of 8 weights");
  return N;
}

std::vector<Tensor> GemvInt4(const Tensor& x, const Tensor& q, const Tensor& scale,
                             const paddle::optional<Tensor>& bias, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(x, "x", DataType::FLOAT32, 2);
  const int64_t B = x.shape()[0], K = x.shape()[1];
  const int64_t N = check_int4(q, scale, K);
  const float* b = optional_vector(bias, "bias", N);
  Tensor y = paddle::empty({B, N}, DataType::FLOAT32, paddle::CPUPlace());
  plk::gemv_int4(i, x.data<float>(), q.data<uint8_t>(), scale.data<float>(), scale.shape()[1], b, y.data<float>(),
                 B, N, K);
  return {y};
}

// int4 x int8 (AVX-512 VNNI only): the int4 layout, and K and the group size multiples of 32 (an
// activation block of 32 never straddles a weight group).
std::vector<Tensor> GemvW4A8(const Tensor& x, const Tensor& q, const Tensor& scale,
                             const paddle::optional<Tensor>& bias, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  PD_CHECK(i == plk::Isa::kAvx512Vnni, "gemv_w4a8 runs on isa avx512_vnni only, got ", isa);
  check_tensor(x, "x", DataType::FLOAT32, 2);
  const int64_t B = x.shape()[0], K = x.shape()[1];
  const int64_t N = check_int4(q, scale, K);
  PD_CHECK(K % 32 == 0 && (K / scale.shape()[1]) % 32 == 0, "gemv_w4a8 needs K (", K, ") and the group size (",
           K / scale.shape()[1], ") to be multiples of 32");
  const float* b = optional_vector(bias, "bias", N);
  Tensor y = paddle::empty({B, N}, DataType::FLOAT32, paddle::CPUPlace());
  plk::gemv_w4a8(i, x.data<float>(), q.data<uint8_t>(), scale.data<float>(), scale.shape()[1], b, y.data<float>(),
                 B, N, K);
  return {y};
}

std::vector<Tensor> DequantizeInt4(const Tensor& q, const Tensor& scale, int k, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  const int64_t N = check_int4(q, scale, k);
  Tensor w = paddle::empty({N, k}, DataType::FLOAT32, paddle::CPUPlace());
  plk::dequantize_int4(i, q.data<uint8_t>(), scale.data<float>(), scale.shape()[1], w.data<float>(), N, k);
  return {w};
}

// ------------------------------------------------------------------- shape / dtype inference
Shapes GemvShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w, const paddle::optional<std::vector<int64_t>>&) {
  return {{x[0], w[0]}};
}
Dtypes GemvDtype(const DataType& x, const DataType&, const paddle::optional<DataType>&) { return {DataType::FLOAT32}; }
Shapes GemvInt8Shape(const std::vector<int64_t>& x, const std::vector<int64_t>& q, const std::vector<int64_t>&,
                     const paddle::optional<std::vector<int64_t>>&) {
  return {{x[0], q[0]}};
}
Dtypes GemvInt8Dtype(const DataType&, const DataType&, const DataType&, const paddle::optional<DataType>&) {
  return {DataType::FLOAT32};
}
Shapes W8A8Shape(const std::vector<int64_t>& x, const std::vector<int64_t>& q, const std::vector<int64_t>&,
                 const paddle::optional<std::vector<int64_t>>&, int, const std::string&) {
  return {{x[0], q[0]}};
}
Shapes DotGroupsShape(const std::vector<int64_t>& x, const std::vector<int64_t>& q, int group, const std::string&) {
  const int64_t G = (group <= 0 || group >= x[1]) ? x[1] : group;
  return {{x[0], q[0], (x[1] + G - 1) / G}};
}
Dtypes DotGroupsDtype(const DataType&, const DataType&) { return {DataType::INT32}; }
Shapes ActQuantShape(const std::vector<int64_t>& x, int group) {
  const int64_t G = (group <= 0 || group >= x[1]) ? x[1] : group;
  return {x, {x[0], (x[1] + G - 1) / G}};
}
Dtypes ActQuantDtype(const DataType&) { return {DataType::INT8, DataType::FLOAT32}; }
Shapes DequantInt4Shape(const std::vector<int64_t>& q, const std::vector<int64_t>&, int k, const std::string&) {
  return {{q[0], k}};
}
Dtypes DequantInt4Dtype(const DataType&, const DataType&) { return {DataType::FLOAT32}; }
Shapes QuantShape(const std::vector<int64_t>& w) { return {w, {w[0]}}; }
Dtypes QuantDtype(const DataType&) { return {DataType::INT8, DataType::FLOAT32}; }

}  // namespace

PD_BUILD_OP(plk_gemv)
    .Inputs({"X", "W", paddle::Optional("Bias")})
    .Outputs({"Y"})
    .Attrs({"isa: std::string"})
    .SetKernelFn(PD_KERNEL(Gemv))
    .SetInferShapeFn(PD_INFER_SHAPE(GemvShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GemvDtype));

PD_BUILD_OP(plk_gemm_f32)
    .Inputs({"X", "W", paddle::Optional("Bias")})
    .Outputs({"Y"})
    .Attrs({"isa: std::string"})
    .SetKernelFn(PD_KERNEL(GemmF32))
    .SetInferShapeFn(PD_INFER_SHAPE(GemvShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GemvDtype));

PD_BUILD_OP(plk_gemv_int8)
    .Inputs({"X", "Q", "Scale", paddle::Optional("Bias")})
    .Outputs({"Y"})
    .Attrs({"isa: std::string"})
    .SetKernelFn(PD_KERNEL(GemvInt8))
    .SetInferShapeFn(PD_INFER_SHAPE(GemvInt8Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GemvInt8Dtype));

PD_BUILD_OP(plk_gemv_w8a8)
    .Inputs({"X", "Q", "Scale", paddle::Optional("Bias")})
    .Outputs({"Y"})
    .Attrs({"group: int", "isa: std::string"})
    .SetKernelFn(PD_KERNEL(GemvW8A8))
    .SetInferShapeFn(PD_INFER_SHAPE(W8A8Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GemvInt8Dtype));

PD_BUILD_OP(plk_int8_dot_groups)
    .Inputs({"XQ", "Q"})
    .Outputs({"Acc"})
    .Attrs({"group: int", "isa: std::string"})
    .SetKernelFn(PD_KERNEL(Int8DotGroups))
    .SetInferShapeFn(PD_INFER_SHAPE(DotGroupsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DotGroupsDtype));

PD_BUILD_OP(plk_quantize_act_int8)
    .Inputs({"X"})
    .Outputs({"XQ", "XS"})
    .Attrs({"group: int"})
    .SetKernelFn(PD_KERNEL(QuantizeActInt8))
    .SetInferShapeFn(PD_INFER_SHAPE(ActQuantShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(ActQuantDtype));

PD_BUILD_OP(plk_gemv_int4)
    .Inputs({"X", "Q", "Scale", paddle::Optional("Bias")})
    .Outputs({"Y"})
    .Attrs({"isa: std::string"})
    .SetKernelFn(PD_KERNEL(GemvInt4))
    .SetInferShapeFn(PD_INFER_SHAPE(GemvInt8Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GemvInt8Dtype));

PD_BUILD_OP(plk_gemv_w4a8)
    .Inputs({"X", "Q", "Scale", paddle::Optional("Bias")})
    .Outputs({"Y"})
    .Attrs({"isa: std::string"})
    .SetKernelFn(PD_KERNEL(GemvW4A8))
    .SetInferShapeFn(PD_INFER_SHAPE(GemvInt8Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(GemvInt8Dtype));

PD_BUILD_OP(plk_dequantize_int4)
    .Inputs({"Q", "Scale"})
    .Outputs({"W"})
    .Attrs({"k: int", "isa: std::string"})
    .SetKernelFn(PD_KERNEL(DequantizeInt4))
    .SetInferShapeFn(PD_INFER_SHAPE(DequantInt4Shape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DequantInt4Dtype));

PD_BUILD_OP(plk_quantize_int8)
    .Inputs({"W"})
    .Outputs({"Q", "Scale"})
    .SetKernelFn(PD_KERNEL(QuantizeInt8))
    .SetInferShapeFn(PD_INFER_SHAPE(QuantShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(QuantDtype));
