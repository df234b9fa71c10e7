// Conversions between fp32 and the 16-bit KV cache element types (bfloat16, IEEE half); see kv_dtype.h.
#include "kv_dtype.h"

#include <cstring>

namespace plk {

uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint16_t f32_to_f16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (127 - 15 - 1) - e + 1: subnormal half = m >> (shift)
    const uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    const uint32_t out = r + ((rem > halfway || (rem == halfway && (r & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | out);
  }
  // normal: rebias the exponent (127 -> 15), keep 10 mantissa bits, round to nearest even
  uint32_t v = a - 0x38000000u;  // (127 - 15) << 23
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    u = sign | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    u = sign;
  } else {  // subnormal: normalize
    e = 113;
    while (!(m & 0x400u)) {
      m <<= 1;
      --e;
    }
    u = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

bool cpu_has_f16c() {
  static const bool has = __builtin_cpu_supports("f16c");
  return has;
}

void kv_store(KvDtype t, const float* src, void* dst, int64_t n) {
  if (t == KvDtype::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (t == KvDtype::kBf16)
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  else
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
}

void kv_load(KvDtype t, const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (t == KvDtype::kF32)
    std::memcpy(dst, src, n * sizeof(float));
  else if (t == KvDtype::kBf16)
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
}

}  // namespace plk
