// The element types of the paged KV cache the CPU kernels read and write (kv_dtype.cc).
//
// A 16-bit cache halves the bytes decode attention streams per token of context. Values are
// rounded once, when written (round to nearest, ties to even, as Paddle's and numpy's casts do);
// every read widens them back to fp32 exactly, and all arithmetic stays fp32. So a kernel over a
// 16-bit cache returns bit-for-bit what it returns over an fp32 cache holding the rounded values.
#pragma once

#include <cstdint>

namespace plk {

enum class KvDtype : int64_t { kF32 = 0, kBf16 = 1, kF16 = 2 };

inline int64_t kv_elem_bytes(KvDtype t) { return t == KvDtype::kF32 ? 4 : 2; }

// Scalar conversions (portable): fp32 -> 16 bits rounds to nearest even; NaN stays NaN (quiet);
// fp32 -> fp16 gives +-inf beyond 65504 and keeps subnormals.
uint16_t f32_to_bf16(float x);
uint16_t f32_to_f16(float x);
float bf16_to_f32(uint16_t h);
float f16_to_f32(uint16_t h);

// dst[0 .. n) (in dtype t) = src[0 .. n) rounded.
void kv_store(KvDtype t, const float* src, void* dst, int64_t n);
// dst[0 .. n) fp32 = src[0 .. n) (in dtype t) widened exactly (portable; the AVX2 decode attention
// widens in registers instead). t == kF32 is a plain copy.
void kv_load(KvDtype t, const void* src, float* dst, int64_t n);

// True when the CPU supports F16C (vcvtph2ps), checked once.
bool cpu_has_f16c();

}  // namespace plk
