// Paddle op registrations of the row-wise layer kernels: RMSNorm, add + RMSNorm and SwiGLU.
// Shared checks: ops_common.h.
#include <string>
#include <vector>

#include "ops_common.h"

namespace {

using namespace plk_ops;

// --------------------------------------------------------------------------------------- RMSNorm
std::vector<Tensor> RmsNorm(const Tensor& x, const Tensor& w, float eps, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(x, "x", DataType::FLOAT32, 2);
  const int64_t T = x.shape()[0], H = x.shape()[1];
  check_tensor(w, "weight", DataType::FLOAT32, 1);
  PD_CHECK(w.shape()[0] == H, "weight must be [", H, "], got [", w.shape()[0], "]");
  Tensor y = paddle::empty({T, H}, DataType::FLOAT32, paddle::CPUPlace());
  plk::rms_norm(i, x.data<float>(), nullptr, w.data<float>(), eps, y.data<float>(), nullptr, T, H);
  return {y};
}

std::vector<Tensor> AddRmsNorm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps,
                               const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(x, "x", DataType::FLOAT32, 2);
  check_tensor(residual, "residual", DataType::FLOAT32, 2);
  const int64_t T = x.shape()[0], H = x.shape()[1];
  PD_CHECK(residual.shape()[0] == T && residual.shape()[1] == H, "residual must have the shape of x [", T, ", ", H,
           "]");
  check_tensor(w, "weight", DataType::FLOAT32, 1);
  PD_CHECK(w.shape()[0] == H, "weight must be [", H, "], got [", w.shape()[0], "]");
  Tensor y = paddle::empty({T, H}, DataType::FLOAT32, paddle::CPUPlace());
  Tensor s = paddle::empty({T, H}, DataType::FLOAT32, paddle::CPUPlace());
  plk::rms_norm(i, x.data<float>(), residual.data<float>(), w.data<float>(), eps, y.data<float>(), s.data<float>(),
                T, H);
  return {y, s};
}

// --------------------------------------------------------------------------------------- SwiGLU
std::vector<Tensor> SwiGlu(const Tensor& gu, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(gu, "x", DataType::FLOAT32, 2);
  const int64_t B = gu.shape()[0], I2 = gu.shape()[1];
  PD_CHECK(I2 % 2 == 0, "x must be [B, 2 * I] (gate columns, then up), got [", B, ", ", I2, "]");
  Tensor out = paddle::empty({B, I2 / 2}, DataType::FLOAT32, paddle::CPUPlace());
  plk::silu_mul(i, gu.data<float>(), out.data<float>(), B, I2 / 2);
  return {out};
}

// ------------------------------------------------------------------- shape / dtype inference
Shapes NormShape(const std::vector<int64_t>& x, const std::vector<int64_t>&) { return {x}; }
Dtypes NormDtype(const DataType&, const DataType&) { return {DataType::FLOAT32}; }
Shapes AddNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {x, x};
}
Dtypes AddNormDtype(const DataType&, const DataType&, const DataType&) { return {DataType::FLOAT32, DataType::FLOAT32}; }
Shapes SwiGluShape(const std::vector<int64_t>& x, const std::string&) { return {{x[0], x[1] / 2}}; }
Dtypes SwiGluDtype(const DataType&) { return {DataType::FLOAT32}; }

}  // namespace

PD_BUILD_OP(plk_rms_norm)
    .Inputs({"X", "Weight"})
    .Outputs({"Y"})
    .Attrs({"eps: float", "isa: std::string"})
    .SetKernelFn(PD_KERNEL(RmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(NormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(NormDtype));

PD_BUILD_OP(plk_add_rms_norm)
    .Inputs({"X", "Residual", "Weight"})
    .Outputs({"Y", "Sum"})
    .Attrs({"eps: float", "isa: std::string"})
    .SetKernelFn(PD_KERNEL(AddRmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(AddNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AddNormDtype));

PD_BUILD_OP(plk_swiglu)
    .Inputs({"X"})
    .Outputs({"Out"})
    .Attrs({"isa: std::string"})
    .SetKernelFn(PD_KERNEL(SwiGlu))
    .SetInferShapeFn(PD_INFER_SHAPE(SwiGluShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SwiGluDtype));

