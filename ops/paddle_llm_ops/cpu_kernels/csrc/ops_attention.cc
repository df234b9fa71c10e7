// Paddle op registrations of the KV-cache kernels: the fused rotary embedding + paged KV write, and
// paged decode and prefill attention. Shared checks: ops_common.h.
#include <string>
#include <vector>

#include "ops_common.h"

namespace {

using namespace plk_ops;

// ---------------------------------------------------------------------------- rotary + KV write
// The cache's element type (float32, bfloat16 or float16; kv_dtype.h) after its checks.
plk::KvDtype check_cache(const Tensor& c, const char* name, int64_t kvh, int64_t d) {
  const DataType t = c.dtype();
  PD_CHECK(t == DataType::FLOAT32 || t == DataType::BFLOAT16 || t == DataType::FLOAT16, name, " has dtype ", t,
           ", expected float32, bfloat16 or float16");
  check_tensor(c, name, t, 3);
  PD_CHECK(c.shape()[0] == kvh && c.shape()[2] == d, name, " must be [num_kv_heads=", kvh, ", slots, head_dim=", d,
           "], got [", c.shape()[0], ", ", c.shape()[1], ", ", c.shape()[2], "]");
  return t == DataType::FLOAT32 ? plk::KvDtype::kF32 : t == DataType::BFLOAT16 ? plk::KvDtype::kBf16
                                                                                : plk::KvDtype::kF16;
}

plk::KvDtype check_caches(const Tensor& k_cache, const Tensor& v_cache, int64_t kvh, int64_t d) {
  const plk::KvDtype t = check_cache(k_cache, "k_cache", kvh, d);
  check_cache(v_cache, "v_cache", kvh, d);
  PD_CHECK(v_cache.dtype() == k_cache.dtype(), "k_cache and v_cache must have one dtype, got ", k_cache.dtype(),
           " and ", v_cache.dtype());
  PD_CHECK(v_cache.shape()[1] == k_cache.shape()[1], "k_cache and v_cache must have the same number of slots");
  return t;
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
  const plk::KvDtype kv_dtype = check_caches(k_cache, v_cache, num_kv_heads, d);
  const int64_t S = k_cache.shape()[1];
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
  a.k_cache = k_cache.data();
  a.v_cache = v_cache.data();
  a.kv_dtype = kv_dtype;
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
  PD_CHECK(k_cache.shape().size() == 3, "k_cache must have 3 dims, got ", k_cache.shape().size());
  const int64_t kvh = k_cache.shape()[0], S = k_cache.shape()[1];
  const plk::KvDtype kv_dtype = check_caches(k_cache, v_cache, kvh, d);
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
  a.k_cache = k_cache.data();
  a.v_cache = v_cache.data();
  a.kv_dtype = kv_dtype;
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

// ----------------------------------------------------------------------- paged prefill attention
std::vector<Tensor> PrefillAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                     const Tensor& context_slots, int64_t start_pos, float scale,
                                     const std::string& isa) {
  plk::Isa i = parse_isa(isa);
  check_tensor(q, "q", DataType::FLOAT32, 3);
  const int64_t n = q.shape()[0], nh = q.shape()[1], d = q.shape()[2];
  PD_CHECK(k_cache.shape().size() == 3, "k_cache must have 3 dims, got ", k_cache.shape().size());
  const int64_t kvh = k_cache.shape()[0], S = k_cache.shape()[1];
  const plk::KvDtype kv_dtype = check_caches(k_cache, v_cache, kvh, d);
  PD_CHECK(nh % kvh == 0, "num_heads ", nh, " is not a multiple of num_kv_heads ", kvh);
  PD_CHECK(start_pos >= 0, "start_pos must be >= 0, got ", start_pos);
  check_tensor(context_slots, "context_slots", DataType::INT64, 1);
  PD_CHECK(context_slots.shape()[0] == start_pos + n, "context_slots must be [start_pos + n = ", start_pos + n,
           "], got [", context_slots.shape()[0], "]");
  const int64_t* slots = context_slots.data<int64_t>();
  for (int64_t p = 0; p < start_pos + n; ++p)
    PD_CHECK(slots[p] >= 0 && slots[p] < S, "context_slots[", p, "] = ", slots[p], " outside the cache [0, ", S, ")");
  Tensor out = paddle::empty({n, nh * d}, DataType::FLOAT32, paddle::CPUPlace());
  plk::PrefillAttnArgs a{};
  a.q = q.data<float>();
  a.k_cache = k_cache.data();
  a.v_cache = v_cache.data();
  a.kv_dtype = kv_dtype;
  a.slots = slots;
  a.out = out.data<float>();
  a.n = n;
  a.start_pos = start_pos;
  a.nh = nh;
  a.kvh = kvh;
  a.d = d;
  a.S = S;
  a.scale = scale;
  plk::paged_prefill_attention(i, a);
  return {out};
}

// ------------------------------------------------------------------- shape / dtype inference
Shapes RotaryShape(const std::vector<int64_t>& qkv, const std::vector<int64_t>&, const std::vector<int64_t>& cos,
                   const std::vector<int64_t>&, const std::vector<int64_t>& kc, const std::vector<int64_t>& vc,
                   const std::vector<int64_t>&, const paddle::optional<std::vector<int64_t>>&,
                   const paddle::optional<std::vector<int64_t>>&, int num_heads, int, float, const std::string&) {
  return {{qkv[0], num_heads, cos[1]}, kc, vc};
}
Dtypes RotaryDtype(const DataType&, const DataType&, const DataType&, const DataType&, const DataType& kc,
                   const DataType& vc, const DataType&, const paddle::optional<DataType>&,
                   const paddle::optional<DataType>&) {
  return {DataType::FLOAT32, kc, vc};
}
Shapes AttnShape(const std::vector<int64_t>& q, const std::vector<int64_t>&, const std::vector<int64_t>&,
                 const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {{q[0], q[1] * q[2]}};
}
Dtypes AttnDtype(const DataType&, const DataType&, const DataType&, const DataType&, const DataType&) {
  return {DataType::FLOAT32};
}
Shapes PrefillShape(const std::vector<int64_t>& q, const std::vector<int64_t>&, const std::vector<int64_t>&,
                    const std::vector<int64_t>&) {
  return {{q[0], q[1] * q[2]}};
}
Dtypes PrefillDtype(const DataType&, const DataType&, const DataType&, const DataType&) {
  return {DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(plk_prefill_attention)
    .Inputs({"Q", "KCache", "VCache", "ContextSlots"})
    .Outputs({"Out"})
    .Attrs({"start_pos: int64_t", "scale: float", "isa: std::string"})
    .SetKernelFn(PD_KERNEL(PrefillAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(PrefillShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PrefillDtype));

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
