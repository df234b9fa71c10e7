"""Attention over a paged KV cache, for the prefill and the decode parts of a mixed step.

Scaled dot-product attention (Vaswani et al. 2017): softmax(q k^T / sqrt(d)) v, with grouped-query
attention (num_heads = group * num_kv_heads; query head h uses KV head h // group, as HF's
repeat_kv) and a causal mask. Keys and values are read from the cache through slot indices (see
kv_cache.py), so the same code serves fresh prompts, chunked prefill and recomputation.
Scores and softmax run in fp32 whatever the compute dtype (as HF's eager attention does); a cache
stored in a narrower dtype is cast to q's dtype when gathered (kv_cache.gather_kv).
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_ops.kv_cache import gather_kv


def _causal_mask(n: int, start_pos: int) -> paddle.Tensor:
    """[n, start_pos + n] additive fp32: row i may see columns 0 .. start_pos + i."""
    qpos = np.arange(start_pos, start_pos + n)[:, None]
    kpos = np.arange(start_pos + n)[None, :]
    return from_numpy(np.where(kpos <= qpos, 0.0, -np.inf).astype(np.float32))


# Longest run of queries attended in one piece. Longer chunks are split into query blocks, each
# over the keys up to its own last position only: the [heads, n, ctx] score tensor (and its mask and
# softmax) never exceeds this many rows, and the causal upper triangle beyond each block is skipped.
# Measured on SmolLM2's shapes (9 heads, 3 KV heads, d 64), 2 threads: a 1510-token prompt took
# ~200 ms per layer in one piece and ~55 ms in 256-query blocks.
PREFILL_QUERY_BLOCK = 256


def _attend(q: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, start_pos: int, scale: float) -> paddle.Tensor:
    """q: [n, num_heads, d] at positions start_pos ..; k, v: [kvh, start_pos + n, d]. Returns [n, num_heads * d]."""
    n, nh, d = q.shape
    kvh = k.shape[0]
    g = nh // kvh
    ctx = k.shape[1]
    qg = q.reshape([n, kvh, g, d]).transpose([1, 2, 0, 3]).reshape([kvh, g * n, d])
    scores = (paddle.matmul(qg, k, transpose_y=True) * scale).reshape([kvh, g, n, ctx])
    if scores.dtype != paddle.float32:
        scores = scores.astype("float32")
    if n > 1:
        # query i sits at position start_pos + i and sees keys 0 .. start_pos + i.
        scores = scores + _causal_mask(n, start_pos)
    probs = F.softmax(scores, axis=-1).reshape([kvh, g * n, ctx])
    if probs.dtype != v.dtype:
        probs = probs.astype(v.dtype)
    out = paddle.matmul(probs, v).reshape([kvh, g, n, d])
    return out.transpose([2, 0, 1, 3]).reshape([n, nh * d])


def prefill_attention(
    q: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    context_slots: paddle.Tensor,
    start_pos: int,
    scale: float,
    gather_dtype=None,
) -> paddle.Tensor:
    """Causal attention of one sequence's chunk of new tokens over its whole context.

    q: [n, num_heads, d] queries for positions start_pos .. start_pos+n-1.
    k_cache, v_cache: [num_kv_heads, num_slots, d] (already holding this chunk's keys/values).
    context_slots: [start_pos + n] int64 slots of positions 0 .. start_pos+n-1.
    gather_dtype: see kv_cache.gather_kv.
    Returns [n, num_heads * d] in q's dtype. Chunks longer than PREFILL_QUERY_BLOCK run block by block.
    """
    n = q.shape[0]
    k = gather_kv(k_cache, context_slots, q.dtype, gather_dtype)  # [kvh, ctx, d]
    v = gather_kv(v_cache, context_slots, q.dtype, gather_dtype)
    if n <= PREFILL_QUERY_BLOCK:
        return _attend(q, k, v, start_pos, scale)
    outs = []
    for i in range(0, n, PREFILL_QUERY_BLOCK):
        j = min(i + PREFILL_QUERY_BLOCK, n)
        end = start_pos + j  # keys of positions 0 .. start_pos + j - 1
        outs.append(_attend(q[i:j], k[:, :end], v[:, :end], start_pos + i, scale))
    return paddle.concat(outs, axis=0)


def decode_attention(
    q: paddle.Tensor,
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    context_slots: paddle.Tensor,
    key_mask: paddle.Tensor,
    scale: float,
    gather_dtype=None,
) -> paddle.Tensor:
    """One new token per sequence, batched over B sequences with contexts padded to L.

    q: [B, num_heads, d]; context_slots: [B, L] int64 (padding points at any valid slot);
    key_mask: [1, B, 1, L] additive fp32 (0 for real keys, -inf for padding).
    gather_dtype: see kv_cache.gather_kv.
    Returns [B, num_heads * d] in q's dtype.
    """
    b, nh, d = q.shape
    kvh = k_cache.shape[0]
    length = context_slots.shape[1]
    flat = context_slots.reshape([-1])
    k = gather_kv(k_cache, flat, q.dtype, gather_dtype).reshape([kvh, b, length, d])
    v = gather_kv(v_cache, flat, q.dtype, gather_dtype).reshape([kvh, b, length, d])
    qg = q.reshape([b, kvh, nh // kvh, d]).transpose([1, 0, 2, 3])  # [kvh, B, g, d]
    scores = paddle.matmul(qg, k, transpose_y=True) * scale  # [kvh, B, g, L]
    if scores.dtype != paddle.float32:
        scores = scores.astype("float32")
    probs = F.softmax(scores + key_mask, axis=-1)
    if probs.dtype != v.dtype:
        probs = probs.astype(v.dtype)
    out = paddle.matmul(probs, v)  # [kvh, B, g, d]
    return out.transpose([1, 0, 2, 3]).reshape([b, nh * d])
