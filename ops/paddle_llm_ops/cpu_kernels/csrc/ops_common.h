// Shared by the Paddle op registrations of the CPU decode kernels, which are split by kind of op
// into ops_linear.cc, ops_attention.cc and ops_norm_act.cc (the only files that include Paddle; the
// kernels stay Paddle-free and compile fast): the parsing of the `isa` attribute and the tensor checks.
//
// Every op takes the attribute `isa` ("avx512_vnni" | "avx2_fma" | "generic"): the Python side
// chooses it (the platform layer decides from the CPU's flags); a request for an isa the CPU's
// cpuid lacks is refused here with an error instead of running into SIGILL. "avx512_vnni" runs the
// int8 x int8 GEMV on AVX-512 VNNI and every other op on its AVX2+FMA code. All tensors must be dense, contiguous
// and on the CPU place; each op checks shapes, dtypes and index bounds before any kernel runs (a bad
// slot or block id raises instead of writing outside the cache).
#pragma once

#include <string>
#include <vector>

#include "kernels.h"
#include "paddle/extension.h"

namespace plk_ops {

using paddle::DataType;
using paddle::Tensor;
using Shapes = std::vector<std::vector<int64_t>>;
using Dtypes = std::vector<DataType>;

inline plk::Isa parse_isa(const std::string& isa) {
  if (isa == "generic") return plk::Isa::kGeneric;
  if (isa == "avx2_fma") {
    PD_CHECK(plk::cpu_has_avx2_fma(),
             "isa 'avx2_fma' requested but this CPU (or OS) does not support AVX2 and FMA; use 'generic'");
    return plk::Isa::kAvx2Fma;
  }
  if (isa == "avx512_vnni") {
    PD_CHECK(plk::cpu_has_avx512_vnni(),
             "isa 'avx512_vnni' requested but this CPU (or OS) does not support AVX-512 F/BW/VNNI with AVX2 and FMA; "
             "use 'avx2_fma' or 'generic'");
    return plk::Isa::kAvx512Vnni;
  }
  PD_THROW("unknown isa '", isa, "' (expected 'avx512_vnni', 'avx2_fma' or 'generic')");
}

inline void check_tensor(const Tensor& t, const char* name, DataType dtype, size_t ndim) {
  PD_CHECK(t.is_cpu(), name, " must be on the CPU place");
  PD_CHECK(t.is_dense_tensor(), name, " must be a dense tensor");
  PD_CHECK(t.dtype() == dtype, name, " has dtype ", t.dtype(), ", expected ", dtype);
  PD_CHECK(t.shape().size() == ndim, name, " must have ", ndim, " dims, got ", t.shape().size());
  PD_CHECK(t.is_contiguous(), name, " must be contiguous");
}

inline const float* optional_vector(const paddle::optional<Tensor>& t, const char* name, int64_t n) {
  if (!t) return nullptr;
  check_tensor(*t, name, DataType::FLOAT32, 1);
  PD_CHECK(t->shape()[0] == n, name, " has ", t->shape()[0], " elements, expected ", n);
  return t->data<float>();
}

}  // namespace plk_ops
