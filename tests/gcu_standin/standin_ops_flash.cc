// Stand-in reference kernel of paddle-custom-gcu's flash_attn_var_len_gcu (tests only; NOT an
// Enflame GCU, not TopsFA): exact softmax attention, one query row at a time, double accumulation.
//
// Semantics modelled on flash-attn's varlen forward (flash_attn_varlen_func), which the real op's
// topsfaFlashAttnVarlenFwd mirrors argument for argument:
//   query [total_q, H, D]; sequence s owns query rows cu_seqlens_q[s] .. cu_seqlens_q[s+1].
//   Paged (block_table given): key/value [num_blocks, block_size, Hk, D]; key position j of
//   sequence s lives in block block_table[s, j / block_size] at offset j % block_size, and the
//   sequence has seqused_k[s] keys (block_table requires seqused_k, as the real wrapper asserts).
//   Unpaged: key/value [total_k, Hk, D], rows cu_seqlens_k[s] .. (+ seqused_k[s] if given, else
//   cu_seqlens_k[s+1]).
//   GQA: query head h reads kv head h / (H / Hk).
//   is_causal: bottom-right aligned (flash-attn >= 2.1): query row i of a sequence with q_len
//   queries and k_len keys sees keys j <= i + k_len - q_len; window_size_left / right (-1 =
//   unbounded) bound j to [i + shift - left, i + shift + right].
//   softcap > 0: score = softcap * tanh(score / softcap) on the scaled score. alibi_slopes [H] or
//   [b, H] (fp32): score -= slope * |i + shift - j|.
//   A row that sees no key, and query rows past cu_seqlens_q[b], are zeros.
// Not modelled (the stand-in raises): p_dropout != 0, leftpad_k. zero_tensors / return_softmax
// change nothing here (no softmax output is returned by the real op either).
// The stand-in also raises when a sequence is longer than max_seqlen_q / max_seqlen_k or a block
// index is out of range: the real kernel sizes its work from those and would read garbage.

#include <algorithm>
#include <limits>

#include "standin_ops.h"

using standin::Dim;
using standin::Shape;

namespace {

struct AttnArgs {
  int64_t total_q, heads, head_dim, kv_heads, block_size;  // block_size 0: unpaged
  int64_t max_blocks, num_blocks;
  float scale, softcap;
  bool causal;
  int64_t window_left, window_right;
  std::vector<int64_t> cu_q, cu_k, used_k, table;
  std::vector<float> alibi;  // [H] or [b, H], empty: none
  int64_t alibi_stride;      // 0 for [H], H for [b, H]
};

// Row index (into key/value viewed as [rows, Hk, D]) of key position j of sequence s.
int64_t KeyRow(const AttnArgs& a, int64_t s, int64_t j) {
  if (a.block_size == 0) return a.cu_k[s] + j;
  const int64_t blk = a.table[s * a.max_blocks + j / a.block_size];
  PD_CHECK(blk >= 0 && blk < a.num_blocks, "flash_attn_var_len_gcu: block_table[", s, ", ", j / a.block_size, "] = ",
           blk, " outside the cache's ", a.num_blocks, " blocks");
  return blk * a.block_size + j % a.block_size;
}

int64_t KeyLen(const AttnArgs& a, int64_t s) {
  if (!a.used_k.empty()) return a.used_k[s];
  return a.cu_k[s + 1] - a.cu_k[s];
}

// One query row (sequence s, row i of q_len, head h) against keys [lo, hi].
template <typename T>
void AttendRow(const AttnArgs& a, const T* q, const T* k, const T* v, T* out, int64_t s, int64_t i, int64_t h,
               int64_t lo, int64_t hi, int64_t shift) {
  const int64_t D = a.head_dim, kvh = h / (a.heads / a.kv_heads);
  std::vector<double> score(static_cast<size_t>(hi - lo + 1));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = lo; j <= hi; ++j) {
    const T* kr = k + (KeyRow(a, s, j) * a.kv_heads + kvh) * D;
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(static_cast<float>(q[d])) * static_cast<float>(kr[d]);
    double sc = dot * a.scale;
    if (a.softcap > 0.f) sc = a.softcap * std::tanh(sc / a.softcap);
    if (!a.alibi.empty()) sc -= a.alibi[s * a.alibi_stride + h] * std::fabs(static_cast<double>(i + shift - j));
    score[j - lo] = sc;
    mx = std::max(mx, sc);
  }
  double denom = 0.0;
  for (double& sc : score) denom += (sc = std::exp(sc - mx));
  std::vector<double> acc(static_cast<size_t>(D), 0.0);
  for (int64_t j = lo; j <= hi; ++j) {
    const T* vr = v + (KeyRow(a, s, j) * a.kv_heads + kvh) * D;
    for (int64_t d = 0; d < D; ++d) acc[d] += score[j - lo] * static_cast<float>(vr[d]);
  }
  for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(static_cast<float>(acc[d] / denom));
}

template <typename T>
void Attend(const AttnArgs& a, const T* q, const T* k, const T* v, T* out) {
  const int64_t row = a.heads * a.head_dim;
  std::fill(out, out + a.total_q * row, static_cast<T>(0.f));
  const int64_t batch = static_cast<int64_t>(a.cu_q.size()) - 1;
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t q_len = a.cu_q[s + 1] - a.cu_q[s], k_len = KeyLen(a, s), shift = k_len - q_len;
    for (int64_t i = 0; i < q_len; ++i) {
      int64_t hi = a.causal ? i + shift : k_len - 1;
      if (a.window_right >= 0) hi = std::min(hi, i + shift + a.window_right);
      hi = std::min(hi, k_len - 1);
      const int64_t lo = a.window_left >= 0 ? std::max<int64_t>(0, i + shift - a.window_left) : 0;
      if (hi < lo) continue;  // sees no key: zeros, as flash-attn
      for (int64_t h = 0; h < a.heads; ++h) {
        const int64_t off = (a.cu_q[s] + i) * row + h * a.head_dim;
        AttendRow(a, q + off, k, v, out + off, s, i, h, lo, hi, shift);
      }
    }
  }
}

void CheckSequences(const AttnArgs& a, int max_seqlen_q, int max_seqlen_k) {
  const char* op = "flash_attn_var_len_gcu";
  const int64_t batch = static_cast<int64_t>(a.cu_q.size()) - 1;
  PD_CHECK(batch >= 0 && a.cu_q[0] == 0 && a.cu_q[batch] <= a.total_q, op, ": cu_seqlens_q must start at 0 and end "
           "<= total_q ", a.total_q);
  PD_CHECK(a.block_size == 0 || static_cast<int64_t>(a.used_k.size()) == batch, op,
           ": block_table needs seqused_k with one entry per sequence");
  PD_CHECK(!a.used_k.empty() || static_cast<int64_t>(a.cu_k.size()) == batch + 1, op,
           ": give seqused_k or cu_seqlens_k [b+1]");
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t q_len = a.cu_q[s + 1] - a.cu_q[s], k_len = KeyLen(a, s);
    PD_CHECK(q_len >= 0 && q_len <= max_seqlen_q, op, ": sequence ", s, " has ", q_len, " queries, max_seqlen_q ",
             max_seqlen_q);
    PD_CHECK(k_len >= 0 && k_len <= max_seqlen_k, op, ": sequence ", s, " has ", k_len, " keys, max_seqlen_k ",
             max_seqlen_k);
    PD_CHECK(a.block_size == 0 || k_len <= a.max_blocks * a.block_size, op, ": sequence ", s, " has ", k_len,
             " keys, its block_table row holds ", a.max_blocks * a.block_size);
  }
}

AttnArgs MakeArgs(const paddle::Tensor& query, const paddle::Tensor& key, const paddle::Tensor& cu_seqlens_q,
                  const paddle::optional<paddle::Tensor>& cu_seqlens_k, const paddle::optional<paddle::Tensor>& seqused_k,
                  const paddle::optional<paddle::Tensor>& block_table, const paddle::optional<paddle::Tensor>& alibi) {
  const char* op = "flash_attn_var_len_gcu";
  AttnArgs a{};
  PD_CHECK(query.shape().size() == 3, op, ": query ", Shape(query), " must be [total_q, heads, head_dim]");
  a.total_q = Dim(query, 0), a.heads = Dim(query, 1), a.head_dim = Dim(query, 2);
  a.cu_q = standin::Ints(cu_seqlens_q, "cu_seqlens_q");
  if (cu_seqlens_k) a.cu_k = standin::Ints(*cu_seqlens_k, "cu_seqlens_k");
  if (seqused_k) a.used_k = standin::Ints(*seqused_k, "seqused_k");
  if (block_table) {
    PD_CHECK(key.shape().size() == 4 && block_table->shape().size() == 2, op, ": paged key ", Shape(key),
             " must be [num_blocks, block_size, kv_heads, head_dim], block_table ", Shape(*block_table), " 2-D");
    a.num_blocks = Dim(key, 0), a.block_size = Dim(key, 1), a.kv_heads = Dim(key, 2);
    a.max_blocks = Dim(*block_table, 1);
    a.table = standin::Ints(*block_table, "block_table");
  } else {
    PD_CHECK(key.shape().size() == 3, op, ": unpaged key ", Shape(key), " must be [total_k, kv_heads, head_dim]");
    a.kv_heads = Dim(key, 1);
  }
  PD_CHECK(Dim(key, -1) == a.head_dim && a.kv_heads > 0 && a.heads % a.kv_heads == 0, op, ": query ", Shape(query),
           " and key ", Shape(key), " disagree on head_dim, or heads is not a multiple of kv_heads");
  if (alibi) {
    PD_CHECK(alibi->dtype() == paddle::DataType::FLOAT32 && alibi->numel() % a.heads == 0, op,
             ": alibi_slopes must be fp32 [heads] or [batch, heads]");
    a.alibi.assign(alibi->data<float>(), alibi->data<float>() + alibi->numel());
    a.alibi_stride = alibi->numel() == a.heads ? 0 : a.heads;
  }
  return a;
}

std::vector<paddle::Tensor> FlashAttnCommon(
    const paddle::Tensor& query, const paddle::Tensor& key, const paddle::Tensor& value,
    const paddle::Tensor& cu_seqlens_q, const paddle::optional<paddle::Tensor>& cu_seqlens_k,
    const paddle::optional<paddle::Tensor>& seqused_k, const paddle::optional<paddle::Tensor>& leftpad_k,
    const paddle::optional<paddle::Tensor>& block_table, const paddle::optional<paddle::Tensor>& alibi_slopes,
    int max_seqlen_q, int max_seqlen_k, float p_dropout, float softmax_scale, bool is_causal, int window_size_left,
    int window_size_right, float softcap) {
  standin::LogCall("flash_attn_var_len_gcu", query);
  const char* op = "flash_attn_var_len_gcu";
  PD_CHECK(p_dropout == 0.f, op, ": the stand-in models inference only (p_dropout must be 0, got ", p_dropout, ")");
  PD_CHECK(!leftpad_k, op, ": leftpad_k is not modelled by the stand-in");
  PD_CHECK(key.shape() == value.shape() && key.dtype() == query.dtype() && value.dtype() == query.dtype(), op,
           ": key ", Shape(key), " / value ", Shape(value), " must match each other and query's dtype");
  AttnArgs a = MakeArgs(query, key, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes);
  a.scale = softmax_scale, a.softcap = softcap, a.causal = is_causal;
  a.window_left = window_size_left, a.window_right = window_size_right;
  CheckSequences(a, max_seqlen_q, max_seqlen_k);
  paddle::Tensor out = standin::Empty(query.shape(), query.dtype(), query.place());
  STANDIN_DISPATCH_FLOAT(query.dtype(), op, [&] {
    Attend<data_t>(a, query.data<data_t>(), key.data<data_t>(), value.data<data_t>(), standin::Mutable<data_t>(out));
  });
  return {out};
}

}  // namespace

#ifndef STANDIN_VARIANT_BROKEN
std::vector<paddle::Tensor> FlashAttnVarLen(
    const paddle::Tensor& query, const paddle::Tensor& key, const paddle::Tensor& value,
    const paddle::Tensor& cu_seqlens_q, const paddle::optional<paddle::Tensor>& cu_seqlens_k,
    const paddle::optional<paddle::Tensor>& seqused_k, const paddle::optional<paddle::Tensor>& leftpad_k,
    const paddle::optional<paddle::Tensor>& block_table, const paddle::optional<paddle::Tensor>& alibi_slopes,
    int max_seqlen_q, int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, bool is_causal,
    int window_size_left, int window_size_right, float softcap, bool return_softmax) {
  (void)zero_tensors, (void)return_softmax;
  return FlashAttnCommon(query, key, value, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table,
                         alibi_slopes, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, is_causal,
                         window_size_left, window_size_right, softcap);
}
#define STANDIN_FLASH_ATTRS                                                                                   \
  {"max_seqlen_q: int", "max_seqlen_k: int", "p_dropout: float", "softmax_scale: float", "zero_tensors: bool", \
   "is_causal: bool", "window_size_left: int", "window_size_right: int", "softcap: float", "return_softmax: bool"}
#else
// Wrong signature on purpose: no `softcap`, an extra trailing `head_size: int`.
std::vector<paddle::Tensor> FlashAttnVarLen(
    const paddle::Tensor& query, const paddle::Tensor& key, const paddle::Tensor& value,
    const paddle::Tensor& cu_seqlens_q, const paddle::optional<paddle::Tensor>& cu_seqlens_k,
    const paddle::optional<paddle::Tensor>& seqused_k, const paddle::optional<paddle::Tensor>& leftpad_k,
    const paddle::optional<paddle::Tensor>& block_table, const paddle::optional<paddle::Tensor>& alibi_slopes,
    int max_seqlen_q, int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, bool is_causal,
    int window_size_left, int window_size_right, bool return_softmax, int head_size) {
  (void)zero_tensors, (void)return_softmax, (void)head_size;
  return FlashAttnCommon(query, key, value, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table,
                         alibi_slopes, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, is_causal,
                         window_size_left, window_size_right, 0.f);
}
#define STANDIN_FLASH_ATTRS                                                                                   \
  {"max_seqlen_q: int", "max_seqlen_k: int", "p_dropout: float", "softmax_scale: float", "zero_tensors: bool", \
   "is_causal: bool", "window_size_left: int", "window_size_right: int", "return_softmax: bool", "head_size: int"}
#endif

using OptShape = paddle::optional<std::vector<int64_t>>;
using OptDtype = paddle::optional<paddle::DataType>;
std::vector<std::vector<int64_t>> FlashAttnVarLenShape(const std::vector<int64_t>& q, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                       const OptShape&, const OptShape&, const OptShape&,
                                                       const OptShape&, const OptShape&) {
  return {q};
}
std::vector<paddle::DataType> FlashAttnVarLenDtype(const paddle::DataType& q, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&, const OptDtype&,
                                                   const OptDtype&, const OptDtype&, const OptDtype&,
                                                   const OptDtype&) {
  return {q};
}

PD_BUILD_OP(flash_attn_var_len_gcu)
    .Inputs({"query", "key", "value", "cu_seqlens_q", paddle::Optional("cu_seqlens_k"), paddle::Optional("seqused_k"),
             paddle::Optional("leftpad_k"), paddle::Optional("block_table"), paddle::Optional("alibi_slopes")})
    .Outputs({"attention_out"})
    .Attrs(STANDIN_FLASH_ATTRS)
    .SetKernelFn(PD_KERNEL(FlashAttnVarLen))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashAttnVarLenShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FlashAttnVarLenDtype));
