// Shared helpers of the stand-in GCU plug-in's custom ops (tests only; NOT an Enflame GCU).
//
// The stand-in's "device memory" is host memory (standin_gcu.cc), so an op reads and writes a
// gcu tensor's data pointer directly. Every op here is a plain loop written to be obviously right:
// these ops are the oracle the engine's GCU path is tested against, never fast.
#pragma once

#include <pthread.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "paddle/phi/api/all.h"
#include "paddle/phi/core/dense_tensor.h"
#include "paddle/phi/core/device_context.h"

namespace standin {

// Env STANDIN_GCU_CALL_LOG=<path>: append "<op> [<dims of the first input>]" to <path> (read at
// every call, so a test may set it after the plug-in loaded). A lock serialises the lines; the
// mutex is a plain C object (no destructor runs at process exit).
inline void LogCall(const char* op, const paddle::Tensor& first) {
  const char* path = std::getenv("STANDIN_GCU_CALL_LOG");
  if (path == nullptr || *path == '\0') return;
  std::string line = op;
  line += " [";
  const std::vector<int64_t> dims = first.shape();
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) line += ", ";
    line += std::to_string(dims[i]);
  }
  line += "]\n";
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&mu);
  if (FILE* f = std::fopen(path, "a")) {
    std::fputs(line.c_str(), f);
    std::fclose(f);
  }
  pthread_mutex_unlock(&mu);
}

// A new tensor of `shape` / `dtype` on `place`, allocated by that place's device context (as the
// real plug-in's ops allocate their outputs), contents undefined.
inline paddle::Tensor Empty(const std::vector<int64_t>& shape, paddle::DataType dtype, const phi::Place& place) {
  auto dense = std::make_shared<phi::DenseTensor>();
  dense->Resize(common::make_ddim(shape));
  paddle::experimental::DeviceContextPool::Instance().Get(place)->Alloc(dense.get(), dtype);
  return paddle::Tensor(dense);
}

// A second tensor object over the same memory as t (the real ops return their in-place-written
// inputs this way: `std::make_shared<phi::DenseTensor>(*input)`).
inline paddle::Tensor Alias(const paddle::Tensor& t) {
  return paddle::Tensor(std::make_shared<phi::DenseTensor>(*static_cast<const phi::DenseTensor*>(t.impl().get())));
}

template <typename T>
T* Mutable(const paddle::Tensor& t) {  // the stand-in writes its in-place operands directly
  return const_cast<T*>(t.data<T>());
}

// Integer tensor (int32 or int64) as int64 values.
inline std::vector<int64_t> Ints(const paddle::Tensor& t, const char* what) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == paddle::DataType::INT32) {
    const int32_t* p = t.data<int32_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  } else if (t.dtype() == paddle::DataType::INT64) {
    const int64_t* p = t.data<int64_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  } else {
    PD_THROW(what, " must be int32 or int64, got ", phi::DataTypeToString(t.dtype()));
  }
  return v;
}

inline int64_t Dim(const paddle::Tensor& t, int i) {
  const std::vector<int64_t> d = t.shape();
  return d.at(i < 0 ? d.size() + i : i);
}

inline std::string Shape(const paddle::Tensor& t) {
  std::string s = "[";
  const std::vector<int64_t> d = t.shape();
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace standin

// Runs the lambda-body __VA_ARGS__ with `data_t` bound to the C++ type of DTYPE: float32, float16
// or bfloat16 (the half types convert to and from float exactly as Paddle's own kernels do).
#define STANDIN_DISPATCH_FLOAT(DTYPE, OP, ...)                                                       \
  [&] {                                                                                              \
    switch (DTYPE) {                                                                                 \
      case paddle::DataType::FLOAT32: {                                                              \
        using data_t = float;                                                                        \
        return __VA_ARGS__();                                                                        \
      }                                                                                              \
      case paddle::DataType::FLOAT16: {                                                              \
        using data_t = phi::dtype::float16;                                                          \
        return __VA_ARGS__();                                                                        \
      }                                                                                              \
      case paddle::DataType::BFLOAT16: {                                                             \
        using data_t = phi::dtype::bfloat16;                                                         \
        return __VA_ARGS__();                                                                        \
      }                                                                                              \
      default:                                                                                       \
        PD_THROW(OP, ": dtype ", phi::DataTypeToString(DTYPE), " not supported by the stand-in"); \
    }                                                                                                \
  }()
