// Fused rotary embedding (rotate-half form) + paged KV write, one pass over the qkv projection:
//   q_out[t, i]        = rope(norm_q(q[t, i]), pos[t])                 for query heads i
//   k_cache[j, slot[t]] = rope(norm_k(k[t, j]), pos[t])                for KV heads j
//   v_cache[j, slot[t]] = v[t, j]                                      (bit copy)
// A 16-bit cache (kv_dtype.h) stores k and v rounded to its type; q_out is fp32 either way.
// rope(x)[i]     = x[i] * cos[i]     - x[i + h] * sin[i]        (i < h = d / 2)
// rope(x)[i + h] = x[i + h] * cos[i + h] + x[i] * sin[i + h]
// with each product rounded and then added (no FMA: -ffp-contract=off), which is exactly what
// ops/paddle_llm_ops/rotary.py computes (x * cos + concat(-x2, x1) * sin), so without q/k norms the
// results are bit-identical to the composed path. norm_q / norm_k (Qwen3's per-head RMSNorm over d)
// are applied only when their weights are given.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "common.h"
#include "kernels.h"

namespace plk {
namespace {

inline void head_norm(const float* x, const float* w, float eps, int64_t d, float* out) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t k = 0; k < d; ++k) lanes[k & 7] = lanes[k & 7] + x[k] * x[k];
  float inv = 1.0f / std::sqrt(hsum8_(lanes) / static_cast<float>(d) + eps);
  for (int64_t k = 0; k < d; ++k) out[k] = (x[k] * inv) * w[k];
}

inline void rope_generic(const float* x, const float* cs, const float* sn, int64_t d, float* out) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) {
    float a = x[i], b = x[i + h];
    float lo1 = a * cs[i], lo2 = b * sn[i];
    float hi1 = b * cs[i + h], hi2 = a * sn[i + h];
    out[i] = lo1 - lo2;
    out[i + h] = hi1 + hi2;
  }
}

PLK_AVX2 void rope_avx2(const float* x, const float* cs, const float* sn, int64_t d, float* out) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; i += 8) {
    __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + h);
    __m256 lo = _mm256_sub_ps(_mm256_mul_ps(a, _mm256_loadu_ps(cs + i)), _mm256_mul_ps(b, _mm256_loadu_ps(sn + i)));
    __m256 hi = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(cs + i + h)), _mm256_mul_ps(a, _mm256_loadu_ps(sn + i + h)));
    _mm256_storeu_ps(out + i, lo);
    _mm256_storeu_ps(out + i + h, hi);
  }
}

struct Ctx {
  const RotaryKvArgs* a;
  bool avx;
};

void tokens(void* ctx, int64_t t0, int64_t t1) {
  const Ctx& c = *static_cast<const Ctx*>(ctx);
  const RotaryKvArgs& a = *c.a;
  const int64_t d = a.d, W = (a.nh + 2 * a.kvh) * d;
  float normed[1024], rotated[1024];  // d <= 1024 (checked in ops_attention.cc)
  const int64_t esize = kv_elem_bytes(a.kv_dtype);
  char* kc = static_cast<char*>(a.k_cache);
  char* vc = static_cast<char*>(a.v_cache);
  auto rope = [&](const float* x, const float* cs, const float* sn, float* out) {
    if (c.avx)
      rope_avx2(x, cs, sn, d, out);
    else
      rope_generic(x, cs, sn, d, out);
  };
  for (int64_t t = t0; t < t1; ++t) {
    const float* row = a.qkv + t * W;
    const float* cs = a.cos + a.positions[t] * d;
    const float* sn = a.sin + a.positions[t] * d;
    const int64_t slot = a.slots[t];
    for (int64_t i = 0; i < a.nh; ++i) {
      const float* src = row + i * d;
      if (a.q_norm) {
        head_norm(src, a.q_norm, a.eps, d, normed);
        src = normed;
      }
      rope(src, cs, sn, a.q_out + (t * a.nh + i) * d);
    }
    for (int64_t j = 0; j < a.kvh; ++j) {
      const float* src = row + (a.nh + j) * d;
      if (a.k_norm) {
        head_norm(src, a.k_norm, a.eps, d, normed);
        src = normed;
      }
      const int64_t at = (j * a.S + slot) * d * esize;
      const float* v = row + (a.nh + a.kvh + j) * d;
      if (a.kv_dtype == KvDtype::kF32) {
        rope(src, cs, sn, reinterpret_cast<float*>(kc + at));
        std::memcpy(vc + at, v, d * sizeof(float));
      } else {  // rounded once, here (kv_dtype.h)
        rope(src, cs, sn, rotated);
        kv_store(a.kv_dtype, rotated, kc + at, d);
        kv_store(a.kv_dtype, v, vc + at, d);
      }
    }
  }
}

constexpr int64_t kRopeBytesPerThread = 256 * 1024;

}  // namespace

void rotary_kv_write(Isa isa, const RotaryKvArgs& a) {
  // The AVX2 rope works on 8 lanes of each half: needs d / 2 % 8 == 0 (all common head sizes);
  // other sizes take the generic rope (same results).
  Ctx c{&a, isa != Isa::kGeneric && (a.d / 2) % 8 == 0};
  int64_t bytes = a.T * (a.nh + 2 * a.kvh) * a.d * 4 * 2;
  parallel_ranges(a.T, 1, threads_for(bytes, kRopeBytesPerThread), tokens, &c);
}

}  // namespace plk
