"""Checks of paddle-custom-gcu's kernels the gcu OpSet calls (see kernel_checks/__init__.py for the
contract), each against the composed Paddle ops of this package on the current device:

- "gcu_attention": reshape_and_cache_flash_gcu writes a mixed step's keys/values into a paged
  [num_blocks, block_size, kv_heads, d] cache (compared with index_put on the same cache), then
  ONE flash_attn_var_len_gcu call over every sequence of the step (compared with
  paged_attention.prefill_attention per sequence over the same cache viewed as [kv_heads, slots, d]).
  The step: decodes with 1, block, block + 1 keys (both sides of a block boundary), a fresh prompt
  of 20 tokens, a chunk of 9 tokens after 16 cached ones (chunked prefill / prefix-cache hit), GQA
  (6 query heads on 2 KV heads), shuffled block ids, max_seqlen_q > 1.
- "gcu_rotary": fused_rotary_embedding_gcu (is_neox, cos ‖ sin table) against apply_rotary.
- "gcu_rms_norm": rms_norm_gcu and fused_add_rms_norm_op (both outputs) against the composed RMSNorm.
- "fused_moe": topk_softmax_gcu against softmax + top-k (+ renormalization), and
  moe_align_block_size_gcu + fused_moe_kernel_gcu (moe.moe_experts_fused_gcu) against the composed
  grouped experts, 5 experts, top-2, 11 tokens.
- "gcu_linear_quant": linear_quant_gcu (gcu.linear_quant.GcuQuantLinear, wint8 / wint4) against an
  fp32 matmul by the dequantized weight.
A stub that allocates and computes nothing, or a kernel that reads its inputs in another order,
gives a large difference here. Registered as in-process checks: a plug-in kernel failing raises a
Python error, it does not kill the process.
"""

from __future__ import annotations

import math

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_ops.kernel_checks import difference, random_array, register, worst

_EPS = 1e-6
_BLOCK = 16
_HEADS, _KV_HEADS, _HEAD_DIM = 6, 2, 32
# (cached keys before the step, new tokens) per sequence, decodes first as the engine packs them.
_MIXED_STEP = ((0, 1), (15, 1), (16, 1), (0, 20), (16, 9))


def _copying_views(check):
    """Run `check` with FLAGS_use_stride_kernel off (views made by copies), as the engine runs where
    the device has no `contiguous` kernel: the checks run before the plan's flags are applied, and
    the result of a plug-in op does not depend on it."""
    import functools

    @functools.wraps(check)
    def run(*args, **kw):
        before = paddle.get_flags(["FLAGS_use_stride_kernel"])["FLAGS_use_stride_kernel"]
        paddle.set_flags({"FLAGS_use_stride_kernel": False})
        try:
            return check(*args, **kw)
        finally:
            paddle.set_flags({"FLAGS_use_stride_kernel": before})
    return run


def _t(a: np.ndarray, dtype: str = "float32") -> paddle.Tensor:
    t = from_numpy(a)
    return t if dtype == "float32" or a.dtype.kind in "iu" else t.astype(dtype)


def _paged_step(rng: np.random.Generator):
    """(block tables, slot_mapping [T] int64, cu_seqlens_q, seqused_k) of _MIXED_STEP over shuffled blocks."""
    need = [-(-(s + n) // _BLOCK) for s, n in _MIXED_STEP]
    ids = rng.permutation(sum(need) + 3)  # a few blocks no sequence owns
    tables, at = [], 0
    for k in need:
        tables.append(ids[at:at + k].astype(np.int64))
        at += k
    slots = np.concatenate([tables[i][np.arange(s, s + n) // _BLOCK] * _BLOCK + np.arange(s, s + n) % _BLOCK
                            for i, (s, n) in enumerate(_MIXED_STEP)])
    cu = np.concatenate([[0], np.cumsum([n for _, n in _MIXED_STEP])]).astype(np.int32)
    used = np.asarray([s + n for s, n in _MIXED_STEP], dtype=np.int32)
    return tables, slots, cu, used, len(ids)


class _Meta:
    """The "flash" fields of AttentionMetadata the kernel wrapper reads."""

    def __init__(self, cu, used, tables):
        width = max(len(t) for t in tables)
        table = np.zeros((len(tables), width), dtype=np.int32)
        for i, t in enumerate(tables):
            table[i, :len(t)] = t
        self.cu_seqlens_q, self.seqused_k, self.block_table = _t(cu), _t(used), _t(table)
        self.max_seqlen_q = int(np.diff(cu).max())
        self.max_seqlen_k = int(used.max())


@register("gcu_attention")
@_copying_views
def check_gcu_attention(dtype: str = "float32", **_):
    from paddle_llm_ops.gcu import custom_ops
    from paddle_llm_ops.paged_attention import prefill_attention

    rng = np.random.default_rng(11)
    tables, slots, cu, used, num_blocks = _paged_step(rng)
    t, kvh, d = int(cu[-1]), _KV_HEADS, _HEAD_DIM
    shape = [num_blocks, _BLOCK, kvh, d]
    k_np, v_np = random_array(rng, shape), random_array(rng, shape)
    k_cache, v_cache = _t(k_np, dtype), _t(v_np, dtype)
    k_new, v_new = _t(random_array(rng, (t, kvh, d)), dtype), _t(random_array(rng, (t, kvh, d)), dtype)
    q = _t(random_array(rng, (t, _HEADS, d)), dtype)
    custom_ops.reshape_and_cache_flash(k_new, v_new, k_cache, v_cache, _t(slots.astype(np.int32)))
    # composed: the same write as index_put on the flat [slots, kvh, d] view
    k_ref, v_ref = _t(k_np, dtype).reshape([-1, kvh, d]), _t(v_np, dtype).reshape([-1, kvh, d])
    index = (_t(slots),)
    paddle.index_put_(k_ref, index, k_new)
    paddle.index_put_(v_ref, index, v_new)
    parts = {"reshape_and_cache_flash_gcu key_cache": difference(k_cache.reshape([-1, kvh, d]), k_ref),
             "reshape_and_cache_flash_gcu value_cache": difference(v_cache.reshape([-1, kvh, d]), v_ref)}
    scale = 1.0 / math.sqrt(d)
    out = custom_ops.flash_attn_var_len(q, k_cache, v_cache, _Meta(cu, used, tables), scale)
    k_hs, v_hs = k_ref.transpose([1, 0, 2]), v_ref.transpose([1, 0, 2])  # [kvh, slots, d]
    ref = []
    for i, (s, n) in enumerate(_MIXED_STEP):
        ctx = tables[i][np.arange(s + n) // _BLOCK] * _BLOCK + np.arange(s + n) % _BLOCK
        ref.append(prefill_attention(q[int(cu[i]):int(cu[i + 1])], k_hs, v_hs, _t(ctx), s, scale))
    parts["flash_attn_var_len_gcu"] = difference(out, paddle.concat(ref, axis=0))
    return worst(parts)


@register("gcu_rotary")
@_copying_views
def check_gcu_rotary(dtype: str = "float32", **_):
    from paddle_llm_ops.gcu import custom_ops
    from paddle_llm_ops.rotary import RotaryTable, apply_rotary

    rng = np.random.default_rng(12)
    t, d = 13, _HEAD_DIM
    table = RotaryTable(d, 96, 10000.0)
    positions = rng.integers(0, 96, size=t).astype(np.int64)
    q, k = _t(random_array(rng, (t, _HEADS, d)), dtype), _t(random_array(rng, (t, _KV_HEADS, d)), dtype)
    q_ref, k_ref = q.clone(), k.clone()  # the kernel may rotate in place
    q_out, k_out = custom_ops.fused_rotary_embedding(q, k, table.cos_sin_table(dtype),
                                                  _t(positions.astype(np.int32)).reshape([1, -1]))
    cos, sin = table.lookup(_t(positions))
    if dtype != "float32":
        cos, sin = cos.astype(dtype), sin.astype(dtype)
    return worst({"fused_rotary_embedding_gcu query": difference(q_out, apply_rotary(q_ref, cos, sin)),
                  "fused_rotary_embedding_gcu key": difference(k_out, apply_rotary(k_ref, cos, sin))})


@register("gcu_rms_norm")
@_copying_views
def check_gcu_rms_norm(dtype: str = "float32", **_):
    from paddle_llm_ops.gcu import custom_ops
    from paddle_llm_ops.norm import rms_norm_composed

    rng = np.random.default_rng(13)
    x, delta = _t(random_array(rng, (7, 200)), dtype), _t(random_array(rng, (7, 200)), dtype)
    w = _t(random_array(rng, (200,)), dtype)
    parts = {"rms_norm_gcu": difference(custom_ops.rms_norm(x, w, _EPS), rms_norm_composed(x, w, _EPS))}
    y, s = custom_ops.fused_add_rms_norm(delta, x, w, _EPS)
    s_ref = x + delta
    parts["fused_add_rms_norm_op out"] = difference(y, rms_norm_composed(s_ref, w, _EPS))
    parts["fused_add_rms_norm_op residual_out"] = difference(s, s_ref)
    return worst(parts)


@register("fused_moe")
@_copying_views
def check_fused_moe(dtype: str = "float32", **_):
    import paddle.nn.functional as F

    from paddle_llm_ops.gcu import custom_ops
    from paddle_llm_ops.moe import COMPOSED_MOE, FUSED_GCU_MOE

    rng = np.random.default_rng(14)
    t, hidden, inter, e, k = 11, 48, 40, 5, 2
    logits = _t(random_array(rng, (t, e)))
    probs = F.softmax(logits, axis=-1)
    w_ref, ids_ref = paddle.topk(probs, k, axis=-1)
    w_ref = w_ref / w_ref.sum(axis=-1, keepdim=True)
    w_got, ids_got = custom_ops.topk_softmax(logits, k, True)
    parts = {"topk_softmax_gcu weights": difference(w_got, w_ref),
             "topk_softmax_gcu ids": difference(ids_got.astype("float32"), ids_ref.astype("float32"))}
    gate_up = [random_array(rng, (2 * inter, hidden), 0.2) for _ in range(e)]
    down = [random_array(rng, (hidden, inter), 0.2) for _ in range(e)]
    x = _t(random_array(rng, (t, hidden)), dtype)
    weights = w_ref if dtype == "float32" else w_ref.astype(dtype)
    got = FUSED_GCU_MOE(x, ids_ref, weights, FUSED_GCU_MOE.pack(gate_up, down, dtype))
    ref = COMPOSED_MOE(x, ids_ref, weights, COMPOSED_MOE.pack(gate_up, down, dtype))
    parts["moe_align_block_size_gcu + fused_moe_kernel_gcu"] = difference(got, ref)
    return worst(parts)


@register("gcu_linear_quant")
def check_gcu_linear_quant(dtype: str, bits: int = 8, group_size: int = -1) -> tuple[float, float]:
    """linear_quant_gcu on the current device against x @ (the dequantized weight) + bias with an fp32
    paddle.matmul, per channel (group_size -1) or groups of group_size, with a bias, 5 tokens: a
    rectangular weight (K = 320: two full 128-chunks and a padded one for int4; 384 for groups of 128;
    N = 48) and a square one (K = N, the case whose output width the op's shape rule gets wrong for
    int4: GcuQuantLinear pads it). Returns (max |kernel - composed|, max |composed|) of the worse."""
    rng = np.random.default_rng(16)
    k = 320 if group_size in (-1, 64) else 384
    parts = {f"[{k}, {n}]": _check_one(rng, dtype, bits, group_size, k, n) for n in (48, k)}
    diff, ref, _ = worst(parts)
    return diff, ref


def _check_one(rng, dtype: str, bits: int, group_size: int, k: int, n: int) -> tuple[float, float]:
    from paddle_llm_ops.gcu.linear_quant import GcuQuantLinear, dequantize_linear_quant

    w = random_array(rng, (k, n), 0.1) * rng.uniform(0.2, 2.0, (1, n)).astype(np.float32)
    lin = GcuQuantLinear(w, random_array(rng, (n,)), dtype, bits, group_size)
    x = _t(random_array(rng, (5, k)), dtype)
    ref_w = dequantize_linear_quant(lin.qweight.numpy(), lin.scale.astype("float32").numpy(), bits, k)[:, :n]
    # the reference in fp32 from the same (dtype-rounded) x, scale and bias: only the kernel's own
    # rounding is measured, and it needs no low-precision matmul on the device
    composed = paddle.matmul(x.astype("float32"), from_numpy(ref_w)) + lin.bias.astype("float32")[:n]
    return difference(lin(x), composed)
