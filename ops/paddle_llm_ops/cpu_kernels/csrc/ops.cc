// Paddle custom-op registrations of the CPU decode kernels (the only file that includes Paddle).
//
// Every op takes the attribute `isa` ("avx512_vnni" | "avx2_fma" | "generic"): the Python side
// chooses it (the platform layer decides from the CPU's flags); a request for an isa the CPU's
// cpuid lacks is refused here with an error instead of running into SIGILL. "avx512_vnni" runs the
// int8 x int8 GEMV on AVX-512 VNNI and every other op on its AVX2+FMA code. All tensors must be dense, contiguous
// and on the CPU place; shapes, dtypes and index bounds are checked before any kernel runs (a bad
// slot or block id raises instead of writing outside the cache).
#include <string>
#include <vector>

#include "kernels.h"
#include "paddle/extension.h"

namespace {

using paddle::DataType;
using paddle::Tensor;

plk::Isa parse_isa(const std::string& isa) {
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

void check_tensor(const Tensor& t, const char* name, DataType dtype, size_t ndim) {
  PD_CHECK(t.is_cpu(), name, " must be on the CPU place");
  PD_CHECK(t.is_dense_tensor(), name, " must be a dense tensor");
  PD_CHECK(t.dtype() == dtype, name, " has dtype ", t.dtype(), ", expected ", dtype);
  PD_CHECK(t.shape().size() == ndim, name, " must have ", ndim, " dims, got ", t.shape().size());
  PD_CHECK(t.is_contiguous(), name, " must be contiguous");
}

const float* optional_vector(const paddle::optional<Tensor>& t, const char* name, int64_t n) {
  if (!t) return nullptr;
  check_tensor(*t, name, DataType::FLOAT32, 1);
  PD_CHECK(t->shape()[0] == n, name, " has ", t->shape()[0], " elements, expected ", n);
  return t->data<float>();
}

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

std::vector<Tensor> DequantizeInt4(const Tensor& q, const Tensor& scale, int k, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  const int64_t N = check_int4(q, scale, k);
  Tensor w = paddle::empty({N, k}, DataType::FLOAT32, paddle::CPUPlace());
  plk::dequantize_int4(i, q.data<uint8_t>(), scale.data<float>(), scale.shape()[1], w.data<float>(), N, k);
  return {w};
}

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

// ---------------------------------------------------------------------------- rotary + KV write
void check_cache(const Tensor& c, const char* name, int64_t kvh, int64_t d) {
  check_tensor(c, name, DataType::FLOAT32, 3);
  PD_CHECK(c.shape()[0] == kvh && c.shape()[2] == d, name, " must be [num_kv_heads=", kvh, ", slots, head_dim=", d,
           "], got [", c.shape()[0], ", ", c.shape()[1], ", ", c.shape()[2], "]");
}

std::vector<Tensor> RotaryKv(const Tensor& qkv, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                             Tensor& k_cache, Tensor& v_cache, const Tensor& slot_mapping,
                             const paddle::optional<Tensor>& q_norm, const paddle::optional<Tensor>& k_norm,
                             int num_heads, int num_kv_heads, float eps, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  PD_CHECK(num_heads > 0 && num_kv_heads > 0, "num_heads and num_kv_heads must be positive");
  check_tensor(qkv, "qkv", DataType::FLOAT32, 2);
  check_tensor(cos, "cos", DataType::FLOAT32, 2);
  check_tensor(sin, "sin", DataType::FLOAT32, 2);
  const int64_t T = qkv.shape()[0], d = cos.shape()[1], P = cos.shape()[0];
  PD_CHECK(sin.shape()[0] == P && sin.shape()[1] == d, "sin must have the shape of cos [", P, ", ", d, "]");
  PD_CHECK(d % 2 == 0 && d <= 1024, "head_dim must be even and <= 1024, got ", d);
  PD_CHECK(qkv.shape()[1] == (num_heads + 2 * num_kv_heads) * d, "qkv must be [T, (num_heads + 2 * num_kv_heads) * ",
           d, "] = [T, ", (num_heads + 2 * num_kv_heads) * d, "], got [T, ", qkv.shape()[1], "]");
  check_tensor(positions, "positions", DataType::INT64, 1);
  check_tensor(slot_mapping, "slot_mapping", DataType::INT64, 1);
  PD_CHECK(positions.shape()[0] == T && slot_mapping.shape()[0] == T, "positions and slot_mapping must be [T=", T,
           "]");
  check_cache(k_cache, "k_cache", num_kv_heads, d);
  check_cache(v_cache, "v_cache", num_kv_heads, d);
  const int64_t S = k_cache.shape()[1];
  PD_CHECK(v_cache.shape()[1] == S, "k_cache and v_cache must have the same number of slots");
  const int64_t* pos = positions.data<int64_t>();
  const int64_t* slots = slot_mapping.data<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    PD_CHECK(pos[t] >= 0 && pos[t] < P, "positions[", t, "] = ", pos[t], " outside the rotary table [0, ", P, ")");
    PD_CHECK(slots[t] >= 0 && slots[t] < S, "slot_mapping[", t, "] = ", slots[t], " outside the cache [0, ", S, ")");
  }
  plk::RotaryKvArgs a{};
  a.qkv = qkv.data<float>();
  a.positions = pos;
  a.cos = cos.data<float>();
  a.sin = sin.data<float>();
  a.slots = slots;
  a.q_norm = optional_vector(q_norm, "q_norm", d);
  a.k_norm = optional_vector(k_norm, "k_norm", d);
  PD_CHECK((a.q_norm == nullptr) == (a.k_norm == nullptr), "give both q_norm and k_norm or neither");
  a.eps = eps;
  Tensor q_out = paddle::empty({T, num_heads, d}, DataType::FLOAT32, paddle::CPUPlace());
  a.q_out = q_out.data<float>();
  a.k_cache = k_cache.data<float>();
  a.v_cache = v_cache.data<float>();
  a.T = T;
  a.nh = num_heads;
  a.kvh = num_kv_heads;
  a.d = d;
  a.S = S;
  plk::rotary_kv_write(i, a);
  return {q_out};  // the in-place outputs alias k_cache / v_cache
}

// ------------------------------------------------------------------------ paged decode attention
std::vector<Tensor> DecodeAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                    const Tensor& block_tables, const Tensor& context_lens, float scale,
                                    int block_size, const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(q, "q", DataType::FLOAT32, 3);
  const int64_t B = q.shape()[0], nh = q.shape()[1], d = q.shape()[2];
  check_tensor(k_cache, "k_cache", DataType::FLOAT32, 3);
  const int64_t kvh = k_cache.shape()[0], S = k_cache.shape()[1];
  check_cache(k_cache, "k_cache", kvh, d);
  check_cache(v_cache, "v_cache", kvh, d);
  PD_CHECK(v_cache.shape()[1] == S, "k_cache and v_cache must have the same number of slots");
  PD_CHECK(nh % kvh == 0, "num_heads ", nh, " is not a multiple of num_kv_heads ", kvh);
  PD_CHECK(nh / kvh <= 16, "at most 16 query heads per KV head, got ", nh / kvh);
  PD_CHECK(block_size > 0 && S % block_size == 0, "block_size ", block_size, " must divide the cache slots ", S);
  check_tensor(block_tables, "block_tables", DataType::INT32, 2);
  check_tensor(context_lens, "context_lens", DataType::INT32, 1);
  PD_CHECK(block_tables.shape()[0] == B && context_lens.shape()[0] == B, "block_tables [B, max_blocks] and ",
           "context_lens [B] must have B = ", B, " rows");
  const int64_t max_blocks = block_tables.shape()[1], num_blocks = S / block_size;
  const int32_t* bt = block_tables.data<int32_t>();
  const int32_t* lens = context_lens.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    PD_CHECK(lens[b] >= 0 && lens[b] <= max_blocks * block_size, "context_lens[", b, "] = ", lens[b],
             " outside [0, max_blocks * block_size = ", max_blocks * block_size, "]");
    for (int64_t j = 0; j * block_size < lens[b]; ++j)
      PD_CHECK(bt[b * max_blocks + j] >= 0 && bt[b * max_blocks + j] < num_blocks, "block_tables[", b, ", ", j,
               "] = ", bt[b * max_blocks + j], " outside the cache's blocks [0, ", num_blocks, ")");
  }
  Tensor out = paddle::empty({B, nh * d}, DataType::FLOAT32, paddle::CPUPlace());
  plk::DecodeAttnArgs a{};
  a.q = q.data<float>();
  a.k_cache = k_cache.data<float>();
  a.v_cache = v_cache.data<float>();
  a.block_tables = bt;
  a.context_lens = lens;
  a.out = out.data<float>();
  a.B = B;
  a.nh = nh;
  a.kvh = kvh;
  a.d = d;
  a.S = S;
  a.max_blocks = max_blocks;
  a.block_size = block_size;
  a.scale = scale;
  plk::paged_decode_attention(i, a);
  return {out};
}

// ------------------------------------------------------------------- shape / dtype inference
using Shapes = std::vector<std::vector<int64_t>>;
using Dtypes = std::vector<DataType>;

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
Shapes NormShape(const std::vector<int64_t>& x, const std::vector<int64_t>&) { return {x}; }
Dtypes NormDtype(const DataType&, const DataType&) { return {DataType::FLOAT32}; }
Shapes AddNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {x, x};
}
Dtypes AddNormDtype(const DataType&, const DataType&, const DataType&) { return {DataType::FLOAT32, DataType::FLOAT32}; }
Shapes SwiGluShape(const std::vector<int64_t>& x, const std::string&) { return {{x[0], x[1] / 2}}; }
Dtypes SwiGluDtype(const DataType&) { return {DataType::FLOAT32}; }
Shapes RotaryShape(const std::vector<int64_t>& qkv, const std::vector<int64_t>&, const std::vector<int64_t>& cos,
                   const std::vector<int64_t>&, const std::vector<int64_t>& kc, const std::vector<int64_t>& vc,
                   const std::vector<int64_t>&, const paddle::optional<std::vector<int64_t>>&,
                   const paddle::optional<std::vector<int64_t>>&, int num_heads, int, float, const std::string&) {
  return {{qkv[0], num_heads, cos[1]}, kc, vc};
}
Dtypes RotaryDtype(const DataType&, const DataType&, const DataType&, const DataType&, const DataType&,
                   const DataType&, const DataType&, const paddle::optional<DataType>&,
                   const paddle::optional<DataType>&) {
  return {DataType::FLOAT32, DataType::FLOAT32, DataType::FLOAT32};
}
Shapes AttnShape(const std::vector<int64_t>& q, const std::vector<int64_t>&, const std::vector<int64_t>&,
                 const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {{q[0], q[1] * q[2]}};
}
Dtypes AttnDtype(const DataType&, const DataType&, const DataType&, const DataType&, const DataType&) {
  return {DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(plk_gemv)
    .Inputs({"X", "W", paddle::Optional("Bias")})
    .Outputs({"Y"})
    .Attrs({"isa: std::string"})
    .SetKernelFn(PD_KERNEL(Gemv))
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

PD_BUILD_OP(plk_rotary_kv)
    .Inputs({"Qkv", "Positions", "Cos", "Sin", "KCache", "VCache", "SlotMapping", paddle::Optional("QNorm"),
             paddle::Optional("KNorm")})
    .Outputs({"QOut", "KCacheOut", "VCacheOut"})
    .Attrs({"num_heads: int", "num_kv_heads: int", "eps: float", "isa: std::string"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}})
    .SetKernelFn(PD_KERNEL(RotaryKv))
    .SetInferShapeFn(PD_INFER_SHAPE(RotaryShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RotaryDtype));

PD_BUILD_OP(plk_decode_attention)
    .Inputs({"Q", "KCache", "VCache", "BlockTables", "ContextLens"})
    .Outputs({"Out"})
    .Attrs({"scale: float", "block_size: int", "isa: std::string"})
    .SetKernelFn(PD_KERNEL(DecodeAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(AttnShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AttnDtype));
