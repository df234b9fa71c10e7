"""Thin wrappers over paddle-custom-gcu's custom ops, called through
`paddle.base.core.eager._run_custom_op(name, *inputs, *attrs)` (positional, in the registered order;
signatures.py says which orders the engine was written for). The real wheel's Python wrappers
(`paddle_custom_device.gcu.ops`) differ between versions, so the engine calls the ops directly.

Shapes: T tokens of the step, H query heads, KVH KV heads, D head_dim, b sequences of the step.
Paged KV cache layout of these ops: [num_blocks, block_size, KVH, D] (OpSet.kv_layout "blocks").
"""

from __future__ import annotations

import functools

import paddle


def _run(name: str, *args):
    from paddle.base import core

    return core.eager._run_custom_op(name, *args)


def flash_attn_var_len(q: paddle.Tensor, k_cache: paddle.Tensor, v_cache: paddle.Tensor, meta,
                       scale: float) -> paddle.Tensor:
    """Causal attention of every sequence of a mixed step (prefill chunks, decodes, prefix-cache
    hits) over its paged context, in one `flash_attn_var_len_gcu` call (TopsFA on a GCU).

    q: [T, H, D]; k_cache, v_cache: [num_blocks, block_size, KVH, D] already holding this step's
    keys/values; meta (AttentionMetadata, "flash" fields): cu_seqlens_q int32 [b+1] (query rows of
    sequence i: cu[i] .. cu[i+1]-1), seqused_k int32 [b] (keys of sequence i incl. this step's),
    block_table int32 [b, max_blocks], max_seqlen_q / max_seqlen_k Python ints. Query row j of a
    sequence with n new rows and c keys sits at position c - n + j (flash-attn's bottom-right causal
    alignment). GQA is native (query head h reads KV head h // (H / KVH)). Returns [T, H*D]."""
    t, h, d = q.shape
    out = _run("flash_attn_var_len_gcu", q, k_cache, v_cache, meta.cu_seqlens_q, None, meta.seqused_k, None,
               meta.block_table, None,
               int(meta.max_seqlen_q), int(meta.max_seqlen_k), 0.0, float(scale), False, True, -1, -1, 0.0, False)
    if isinstance(out, (list, tuple)):
        out = out[0]
    return out.reshape([t, h * d])


def reshape_and_cache_flash(k: paddle.Tensor, v: paddle.Tensor, k_cache: paddle.Tensor, v_cache: paddle.Tensor,
                            slot_mapping: paddle.Tensor) -> None:
    """In place: k, v [T, KVH, D] into the caches [num_blocks, block_size, KVH, D] at
    slot_mapping int32 [T] (slot = block * block_size + offset), through `reshape_and_cache_flash_gcu`.
    Called in the kernel function's argument order (caches first), as FastDeploy's GCU backend calls
    it; the op declares (key, value, key_cache, value_cache, slot_mapping) (see signatures.py).
    k / v are cast to the cache's dtype where they differ."""
    if k.dtype != k_cache.dtype:
        k, v = k.astype(k_cache.dtype), v.astype(v_cache.dtype)
    _run("reshape_and_cache_flash_gcu", k_cache, v_cache, k, v, slot_mapping)


@functools.lru_cache(maxsize=1)
def _rotary_head_size_attr() -> bool:
    from paddle_llm_ops.gcu.signatures import rotary_takes_head_size

    return rotary_takes_head_size()


def fused_rotary_embedding(q: paddle.Tensor, k: paddle.Tensor, cos_sin_table: paddle.Tensor,
                           positions: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Rotate-half (NeoX) rotary of q [T, H, D] and k [T, KVH, D] at positions int32 [1, T] through
    `fused_rotary_embedding_gcu`, is_neox=True (interleaved models are permuted to rotate-half at
    load). cos_sin_table: [max_positions, D] = cos of the D/2 frequencies ‖ their sin, in q's dtype.
    The op takes rank-4 query / key [batch, seq, heads, D] (one batch row of T tokens here) and rank-2
    positions [batch, seq], rotates them in place and returns them. Returns (q, k) rotated, shapes
    as given. The newer wheels' `head_size` attribute is passed where the registered op has it."""
    t, h, d = q.shape
    kvh = k.shape[1]
    args = [q.reshape([1, t, h, d]), k.reshape([1, t, kvh, d]), cos_sin_table, positions, True]
    if _rotary_head_size_attr():
        args.append(int(d))
    out = _run("fused_rotary_embedding_gcu", *args)
    return out[0].reshape([t, h, d]), out[1].reshape([t, kvh, d])


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """x [N, C], weight [C] -> x / sqrt(mean(x^2) + eps) * weight through `rms_norm_gcu`."""
    out = _run("rms_norm_gcu", x, weight, float(eps))
    return out[0] if isinstance(out, (list, tuple)) else out


def fused_add_rms_norm(delta: paddle.Tensor, residual: paddle.Tensor, weight: paddle.Tensor,
                       eps: float) -> tuple[paddle.Tensor, paddle.Tensor]:
    """(rms_norm(residual + delta) * weight, residual + delta), [T, C] each, through
    `fused_add_rms_norm_op` (inputs x=delta, residual)."""
    out = _run("fused_add_rms_norm_op", delta, residual, weight, float(eps))
    return out[0], out[1]


def topk_softmax(gating: paddle.Tensor, k: int, renormalize: bool) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Plain softmax top-k routing through `topk_softmax_gcu`: gating [T, E] router logits (fp32 as
    FastDeploy passes them) -> (weights [T, k] fp32: the top-k softmax probabilities, divided by
    their sum when renormalize; ids [T, k] int32, largest first)."""
    t = gating.shape[0]
    weights = paddle.empty([t, k], dtype="float32")
    ids = paddle.empty([t, k], dtype="int32")
    token_expert = paddle.empty([t, k], dtype="int32")
    out = _run("topk_softmax_gcu", weights, ids, token_expert, gating.astype("float32"), bool(renormalize))
    return out[0], out[1]
