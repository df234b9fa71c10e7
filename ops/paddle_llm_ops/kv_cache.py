"""The paged KV cache: write a step's new keys and values, gather a sequence's context back.

Cache layout per layer (OpSet.kv_layout "heads_slots"; the gcu kernels' "blocks" layout
[num_blocks, block_size, num_kv_heads, head_dim] is written by their own op, copied by copy_blocks
below): [num_kv_heads, num_blocks * block_size, head_dim]; the middle axis holds
"slots": a token at position p of a sequence lives in slot
block_table[p // block_size] * block_size + p % block_size. Heads come first so that the gathered
context of one head is contiguous and attention runs as plain batched matmuls (Paddle's CPU matmul
is several times slower on strided or broadcast operands).

The cache may be stored in a narrower dtype than the model computes in (kv_cache_dtype bfloat16 or
float16 under a float32 model): values are cast on write and cast back when gathered. Where Paddle
has no gather kernel for the cache's dtype (CPU: none for float16), the gather runs on a
same-width view (bit-identical) and the cast reads the view as the cache's dtype again.
copy_blocks copies whole blocks (the block manager's copy on write of a shared block).
"""

from __future__ import annotations

import functools

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy

@functools.lru_cache(maxsize=8)
def _head_index(num_heads: int, place: str) -> paddle.Tensor:
    return paddle.arange(num_heads, dtype="int64").unsqueeze(1)


def write_kv(
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    k: paddle.Tensor,
    v: paddle.Tensor,
    slot_mapping: paddle.Tensor,
) -> None:
    """In place. k, v: [T, num_kv_heads, head_dim] in the compute dtype; slot_mapping: [T] int64 slot
    per token. The values are cast to the cache's dtype when it differs."""
    index = (_head_index(k_cache.shape[0], str(k_cache.place)), slot_mapping.unsqueeze(0))
    if k.dtype != k_cache.dtype:
        k, v = k.astype(k_cache.dtype), v.astype(v_cache.dtype)
    paddle.index_put_(k_cache, index, k.transpose([1, 0, 2]))
    paddle.index_put_(v_cache, index, v.transpose([1, 0, 2]))


def gather_kv(cache: paddle.Tensor, slots: paddle.Tensor, compute_dtype, gather_dtype=None) -> paddle.Tensor:
    """The cache rows at `slots` ([N] int64), [num_kv_heads, N, head_dim] in compute_dtype.

    gather_dtype: None, or a dtype of the cache's width to gather through (a bit-identical view)
    when Paddle has no gather kernel for the cache's own dtype on this place."""
    if gather_dtype is None or gather_dtype == cache.dtype:
        out = paddle.index_select(cache, slots, axis=1)
    else:
        out = paddle.index_select(cache.view(gather_dtype), slots, axis=1).view(cache.dtype)
    return out if out.dtype == compute_dtype else out.astype(compute_dtype)


def copy_blocks(kv_caches, pairs, block_size: int, gather_dtype=None, layout: str = "heads_slots") -> None:
    """In place: copy whole KV blocks src -> dst in every layer's K and V cache (copy on write of a
    block that several sequences share). kv_caches: [(k_cache, v_cache)] per layer; pairs:
    [(src block, dst block)]; gather_dtype as in gather_kv; layout: the caches' OpSet.kv_layout,
    "heads_slots" ([kvh, num_blocks * block_size, d]: the blocks' slots are copied) or "blocks"
    ([num_blocks, block_size, kvh, d]: whole rows of axis 0)."""
    if not pairs:
        return
    if layout == "blocks":
        src = from_numpy(np.asarray([s for s, _ in pairs], dtype=np.int64))
        dst = from_numpy(np.asarray([d for _, d in pairs], dtype=np.int64))
        for layer in kv_caches:
            for cache in layer:
                view = None if gather_dtype is None or gather_dtype == cache.dtype else gather_dtype
                rows = paddle.index_select(cache if view is None else cache.view(view), src, axis=0)
                paddle.index_put_(cache, (dst,), rows if view is None else rows.view(cache.dtype))
        return
    offs = np.arange(block_size, dtype=np.int64)
    src = from_numpy(np.concatenate([s * block_size + offs for s, _ in pairs]))
    dst = from_numpy(np.concatenate([d * block_size + offs for _, d in pairs]))
    for layer in kv_caches:
        for cache in layer:
            rows = gather_kv(cache, src, cache.dtype, gather_dtype)
            paddle.index_put_(cache, (_head_index(cache.shape[0], str(cache.place)), dst.unsqueeze(0)), rows)
