// int8 x int8 GEMM for many activation rows (prefill chunks, large decode batches) on AVX-512 VNNI:
// the same scheme and the same result, bit for bit, as the exact path of gemv_w8a8 (gemv_w8a8.cc):
//   v[b, n] = sum_g xs[b, g] * float(acc[b, n, g])  (g ascending, one rounded multiply and one
//             rounded add per group), y[b, n] = v[b, n] * scale[n] (+ bias[n]).
//
// Why a second kernel: the GEMV tiles put the input channels of one weight row across the lanes of a
// register (one output per register, reduced at the end), which suits one pass over the weights;
// with many activation rows the work is the multiply itself, and those tiles spend two more
// instructions (a conversion and a multiply-add) per vpdpbusd. Here the lanes hold 16 output
// channels instead (the layout of a GEMM micro-kernel: BLIS, oneDNN): a panel of 32 weight rows is
// repacked per call as [k / 4][32][4] bytes, each vpdpbusd multiplies 4 input channels of one
// activation row (broadcast) by 4 channels of 16 weight rows, and a group's exact int32 sums are
// converted and scaled once per group of 32 channels: 8 vpdpbusd per conversion.
//
// Unsigned x signed: vpdpbusd takes unsigned activations, so they are offset by +128 (gemv_w8a8.cc's
// xu) and each group's accumulators start at -128 * (sum of the group's weights of that output
// channel), computed while packing: sum (xq + 128) q - 128 sum q = sum xq q, exact in int32.
// A panel is 32 x K bytes (48 KiB at K = 1536): it stays in L1/L2 while every activation row passes.
// Intrinsics: Intel Intrinsics Guide (vpdpbusd).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common.h"
#include "gemv_w8a8.h"

namespace plk {
namespace {

#define PLK_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma")))

constexpr int kNR = 32;  // output channels per panel: two zmm of int32 lanes
constexpr int kMR = 6;   // activation rows per micro-tile: 12 int32 + 12 fp32 accumulators + 3

// A range's packed panels: panel i holds output channels n0 + 32 i .. n0 + 32 i + 31 as
// w[i * kg * 32 + (k / 4) * 128 + j * 4 + (k % 4)] = q[n, k] (zero past N and past K, kg = groups * G)
// and off[(i * groups + g) * 32 + j] = -128 * sum_{k in g} q[n, k].
struct Panels {
  std::vector<int8_t> w;
  std::vector<int32_t> off;
  std::vector<float> ws;     // int4: the weight scale of each (panel, activation group, channel)
  std::vector<int8_t> rows;  // int4: one panel's rows unpacked to int8
};

// Packs the panels of [n0, n1): each 4-byte unit k / 4 of 16 weight rows is one gather (the rows are
// K bytes apart), the last unit of a row whose K is not a multiple of 4 byte by byte; the offsets
// are one vpdpbusd of ones per unit.
// int4 rows -> int8 rows: out [rows][K] from q4 rows of K / 2 bytes (low nibble = even k), each
// nibble sign-extended ((v ^ 8) - 8); 32 bytes per step, pairs interleaved back into k order.
PLK_VNNI void unpack_int4_rows_vnni(const uint8_t* q4, int64_t rows, int64_t K, int8_t* out) {
  const int64_t H = K / 2;
  const __m256i m4 = _mm256_set1_epi8(0x0F), s8 = _mm256_set1_epi8(8);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = q4 + r * H;
    int8_t* dst = out + r * K;
    int64_t j = 0;
    for (; j + 32 <= H; j += 32) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j));
      const __m256i lo = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(b, m4), s8), s8);
      const __m256i hi = _mm256_sub_epi8(_mm256_xor_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4), s8), s8);
      const __m256i u0 = _mm256_unpacklo_epi8(lo, hi), u1 = _mm256_unpackhi_epi8(lo, hi);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * j), _mm256_permute2x128_si256(u0, u1, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * j + 32), _mm256_permute2x128_si256(u0, u1, 0x31));
    }
    for (; j < H; ++j) {
      dst[2 * j] = static_cast<int8_t>(((src[j] & 0x0F) ^ 8) - 8);
      dst[2 * j + 1] = static_cast<int8_t>(((src[j] >> 4) ^ 8) - 8);
    }
  }
}

// Packs the panels of [n0, n1): each 4-byte unit k / 4 of 16 weight rows is one gather (the rows are
// K bytes apart), the last unit of a row whose K is not a multiple of 4 byte by byte; the offsets
// are one vpdpbusd of ones per unit. int4 weights are first unpacked to int8 rows (32 at a time);
// their per-group scales are laid out per panel as pws[(i * groups + g) * 32 + j].
PLK_VNNI void pack_panels_vnni(const W8A8Ctx& c, int64_t n0, int64_t n1, Panels& p) {
  const int64_t kg = c.groups * c.G, units = kg / 4, full = c.K / 4, np = (n1 - n0 + kNR - 1) / kNR;
  p.w.resize(np * kg * kNR);
  p.off.resize(np * c.groups * kNR);
  if (c.q4) {
    p.ws.assign(np * c.groups * kNR, 0.f);
    p.rows.resize(kNR * c.K);
  }
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(static_cast<int32_t>(c.K)));
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t i = 0; i < np; ++i) {
    int8_t* w = p.w.data() + i * kg * kNR;
    const int64_t p0 = n0 + i * kNR, prows = std::min<int64_t>(kNR, c.N - p0);
    const int8_t* src = c.q4 ? p.rows.data() : c.q + p0 * c.K;  // the panel's first weight row
    if (c.q4) {
      unpack_int4_rows_vnni(c.q4 + p0 * (c.K / 2), prows, c.K, p.rows.data());
      const int64_t gw = c.K / c.wgroups;
      for (int64_t j = 0; j < prows; ++j)
        for (int64_t g = 0; g < c.groups; ++g) p.ws[(i * c.groups + g) * kNR + j] = c.ws[(p0 + j) * c.wgroups + g * c.G / gw];
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(16, prows - 16 * h));
      const __mmask16 mk = rows >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1);
      const int8_t* base = src + (rows > 0 ? 16 * h : 0) * c.K;
      int32_t* out = reinterpret_cast<int32_t*>(w) + 16 * h;
      for (int64_t u = 0; u < full; ++u)
        _mm512_storeu_si512(out + u * kNR,
                            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mk, idx, base + 4 * u, 1));
      for (int64_t u = full; u < units; ++u) {  // the partial unit, then the zero-padded ones
        int32_t col[16] = {0};
        for (int64_t r = 0; r < rows; ++r) {
          int8_t b[4] = {0, 0, 0, 0};
          for (int64_t k = 4 * u; k < c.K && k < 4 * u + 4; ++k) b[k - 4 * u] = base[r * c.K + k];
          std::memcpy(&col[r], b, 4);
        }
        _mm512_storeu_si512(out + u * kNR, _mm512_loadu_si512(col));
      }
    }
    const int64_t steps = c.G / 4;
    for (int64_t g = 0; g < c.groups; ++g)
      for (int h = 0; h < 2; ++h) {
        __m512i sum = _mm512_setzero_si512();
        for (int64_t s = 0; s < steps; ++s)
          sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512(w + (g * steps + s) * (kNR * 4) + 64 * h));
        _mm512_storeu_si512(p.off.data() + (i * c.groups + g) * kNR + 16 * h,
                            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
      }
  }
}

// Rows b0 .. b0 + MR - 1 against one packed panel: v[m][0..31] as defined above.
template <int MR>
PLK_VNNI inline void micro_vnni(const W8A8Ctx& c, const int8_t* pw, const int32_t* poff, const float* pws, int64_t b0,
                                __m512 (&v)[kMR][2]) {
  for (int m = 0; m < MR; ++m) v[m][0] = v[m][1] = _mm512_setzero_ps();
  const int64_t steps = c.G / 4;  // vpdpbusd steps per group
  for (int64_t g = 0; g < c.groups; ++g) {
    const __m512i o0 = _mm512_loadu_si512(poff + g * kNR), o1 = _mm512_loadu_si512(poff + g * kNR + 16);
    __m512i a[kMR][2];
    for (int m = 0; m < MR; ++m) {
      a[m][0] = o0;
      a[m][1] = o1;
    }
    const int8_t* w = pw + g * steps * (kNR * 4);
    const uint8_t* x = c.xu + b0 * c.Kp + g * c.G;
    for (int64_t s = 0; s < steps; ++s) {
      const __m512i w0 = _mm512_loadu_si512(w + s * (kNR * 4)), w1 = _mm512_loadu_si512(w + s * (kNR * 4) + 64);
      for (int m = 0; m < MR; ++m) {
        int32_t x4;
        std::memcpy(&x4, x + m * c.Kp + 4 * s, 4);
        const __m512i xb = _mm512_set1_epi32(x4);
        a[m][0] = _mm512_dpbusd_epi32(a[m][0], xb, w0);
        a[m][1] = _mm512_dpbusd_epi32(a[m][1], xb, w1);
      }
    }
    if (pws) {  // int4: v + (xs * ws) * float(acc), the weight scale per channel and group
      const __m512 w0s = _mm512_loadu_ps(pws + g * kNR), w1s = _mm512_loadu_ps(pws + g * kNR + 16);
      for (int m = 0; m < MR; ++m) {
        const __m512 s = _mm512_set1_ps(c.xs[(b0 + m) * c.groups + g]);
        v[m][0] = _mm512_add_ps(v[m][0], _mm512_mul_ps(_mm512_mul_ps(s, w0s), _mm512_cvtepi32_ps(a[m][0])));
        v[m][1] = _mm512_add_ps(v[m][1], _mm512_mul_ps(_mm512_mul_ps(s, w1s), _mm512_cvtepi32_ps(a[m][1])));
      }
      continue;
    }
    for (int m = 0; m < MR; ++m) {  // v + xs * float(acc): the exact path's two roundings
      const __m512 s = _mm512_set1_ps(c.xs[(b0 + m) * c.groups + g]);
      v[m][0] = _mm512_add_ps(v[m][0], _mm512_mul_ps(s, _mm512_cvtepi32_ps(a[m][0])));
      v[m][1] = _mm512_add_ps(v[m][1], _mm512_mul_ps(s, _mm512_cvtepi32_ps(a[m][1])));
    }
  }
}

template <int MR>
PLK_VNNI inline void tile_vnni(const W8A8Ctx& c, const int8_t* pw, const int32_t* poff, const float* pws, int64_t n0,
                               int64_t b0) {
  __m512 v[kMR][2];
  micro_vnni<MR>(c, pw, poff, pws, b0, v);
  const int64_t nr = std::min<int64_t>(kNR, c.N - n0);
  for (int h = 0; h < 2; ++h) {
    const int64_t cols = std::min<int64_t>(16, nr - 16 * h);
    if (cols <= 0) break;
    const __mmask16 mk = cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1);
    const __m512 sc = c.scale ? _mm512_maskz_loadu_ps(mk, c.scale + n0 + 16 * h) : _mm512_setzero_ps();
    const __m512 bi = c.bias ? _mm512_maskz_loadu_ps(mk, c.bias + n0 + 16 * h) : _mm512_setzero_ps();
    for (int m = 0; m < MR; ++m) {
      __m512 o = c.scale ? _mm512_mul_ps(v[m][h], sc) : v[m][h];  // int4: scaled per group already
      if (c.bias) o = _mm512_add_ps(o, bi);
      _mm512_mask_storeu_ps(c.y + (b0 + m) * c.N + n0 + 16 * h, mk, o);
    }
  }
}

// Activation rows per pass over a range's panels: 192 rows of K <= 1536 (about 300 KiB of x) and
// the range's panels stay in L2 while every row of the block meets every panel.
constexpr int64_t kMBlock = 192;

PLK_VNNI void panels_vnni(void* ctx, int64_t n0, int64_t n1) {
  const W8A8Ctx& c = *static_cast<const W8A8Ctx*>(ctx);
  thread_local Panels p;  // the pool's threads live as long as the process: one buffer each
  pack_panels_vnni(c, n0, n1, p);
  const int64_t kg = c.groups * c.G;
  for (int64_t m0 = 0; m0 < c.B; m0 += kMBlock) {
    const int64_t m1 = std::min<int64_t>(c.B, m0 + kMBlock);
    for (int64_t n = n0, i = 0; n < n1; n += kNR, ++i) {
      const int8_t* pw = p.w.data() + i * kg * kNR;
      const int32_t* poff = p.off.data() + i * c.groups * kNR;
      const float* pws = c.q4 ? p.ws.data() + i * c.groups * kNR : nullptr;
      int64_t b = m0;
      for (; b + kMR <= m1; b += kMR) tile_vnni<kMR>(c, pw, poff, pws, n, b);
      switch (m1 - b) {
        case 5: tile_vnni<5>(c, pw, poff, pws, n, b); break;
        case 4: tile_vnni<4>(c, pw, poff, pws, n, b); break;
        case 3: tile_vnni<3>(c, pw, poff, pws, n, b); break;
        case 2: tile_vnni<2>(c, pw, poff, pws, n, b); break;
        case 1: tile_vnni<1>(c, pw, poff, pws, n, b); break;
        default: break;
      }
    }
  }
}

// ---------------------------------------------------------------- activation quantization
// gemv_w8a8.cc's scheme for the VNNI paths, vectorized and threaded over rows: the same values (max
// is exact in any order; the vector division and round-to-nearest-even are the scalar ones, IEEE).
struct QuantCtx {
  const float* x;
  int8_t* xq;
  uint8_t* xu;
  float* xs;
  int64_t K, Kp, G, groups;
};

PLK_VNNI void quant_rows_vnni(void* ctx, int64_t b0, int64_t b1) {
  const QuantCtx& c = *static_cast<const QuantCtx*>(ctx);
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);  // AVX-512 F only: no DQ / VL on this path
  const __m512 lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  for (int64_t b = b0; b < b1; ++b) {
    const float* xr = c.x + b * c.K;
    int8_t* qr = c.xq + b * c.Kp;
    uint8_t* ur = c.xu + b * c.Kp;
    for (int64_t g = 0; g < c.groups; ++g) {
      const int64_t k0 = g * c.G, k1 = std::min<int64_t>(c.K, k0 + c.G);
      __m512 m = _mm512_setzero_ps();
      for (int64_t k = k0; k < k1; k += 16) {
        const __mmask16 mk = k1 - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k1 - k)) - 1);
        const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(mk, xr + k));
        m = _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(bits, absmask)), m);
      }
      const float s = _mm512_reduce_max_ps(m) / 127.0f;
      c.xs[b * c.groups + g] = s;
      const __m512 sv = _mm512_set1_ps(s);
      for (int64_t k = k0; k < k1; k += 16) {
        const __mmask16 mk = k1 - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k1 - k)) - 1);
        __m512 v = s > 0.f ? _mm512_roundscale_ps(_mm512_div_ps(_mm512_maskz_loadu_ps(mk, xr + k), sv),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                           : _mm512_setzero_ps();
        const __m128i q8 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi)));
        const __m128i u8 = _mm_xor_si128(q8, _mm_set1_epi8(static_cast<char>(0x80)));
        if (k1 - k >= 16) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + k), q8);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(ur + k), u8);
        } else {
          alignas(16) int8_t tq[16], tu[16];
          _mm_store_si128(reinterpret_cast<__m128i*>(tq), q8);
          _mm_store_si128(reinterpret_cast<__m128i*>(tu), u8);
          std::memcpy(qr + k, tq, k1 - k);
          std::memcpy(ur + k, tu, k1 - k);
        }
      }
    }
    std::memset(qr + c.K, 0, c.Kp - c.K);  // padding: xq 0, xu 128 (meets zero weights only)
    std::memset(ur + c.K, 128, c.Kp - c.K);
  }
}

int64_t g_min_rows = kW8A8GemmMinRows;

}  // namespace

bool w8a8_gemm_applies(Isa isa, const W8A8Ctx& c) {
  return isa == Isa::kAvx512Vnni && c.acc_out == nullptr && c.xs != nullptr && c.G % 4 == 0 &&
         c.groups * c.G <= c.Kp && c.B >= g_min_rows;
}

void w8a8_gemm_run(W8A8Ctx& c) {
  // Compute-bound: every panel costs B * 32 * K multiply-adds; chunks of whole panels.
  parallel_ranges(c.N, kNR, threads_for(c.B * c.N * c.K / 8, 256 * 1024), panels_vnni, &c);
}

void quantize_activations_vnni(const float* x, int8_t* xq, uint8_t* xu, float* xs, int64_t B, int64_t K, int64_t Kp,
                               int64_t G) {
  QuantCtx q{x, xq, xu, xs, K, Kp, G, (K + G - 1) / G};
  parallel_ranges(B, 1, threads_for(B * K * 4, 256 * 1024), quant_rows_vnni, &q);
}

void w4a8_gemm_run(const float* x, const uint8_t* q, const float* ws, int64_t wgroups, const float* bias, float* y,
                   int64_t B, int64_t N, int64_t K) {
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<uint8_t> xu;
  thread_local std::vector<float> xs;
  W8A8Ctx c{};
  c.B = B;
  c.N = N;
  c.K = K;
  c.G = 32;  // activation blocks of 32 (gemv_w4a8.cc's scheme)
  c.groups = K / 32;
  c.Kp = (K + 63) / 64 * 64 + 64;
  xq.resize(B * c.Kp);
  xu.resize(B * c.Kp);
  xs.resize(B * c.groups);
  quantize_activations_vnni(x, xq.data(), xu.data(), xs.data(), B, K, c.Kp, c.G);
  c.xq = xq.data();
  c.xu = xu.data();
  c.xs = xs.data();
  c.q4 = q;
  c.ws = ws;
  c.wgroups = wgroups;
  c.bias = bias;
  c.y = y;
  w8a8_gemm_run(c);
}

void set_w8a8_gemm_min_rows(int64_t rows) { g_min_rows = rows > 0 ? rows : kW8A8GemmMinRows; }

}  // namespace plk

// Benchmarks and tests (ctypes): the fewest activation rows that take the GEMM; <= 0 restores the default.
extern "C" void plk_set_w8a8_gemm_min_rows(int64_t rows) { plk::set_w8a8_gemm_min_rows(rows); }
