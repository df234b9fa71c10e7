"""Write the new keys and values of a step into the paged KV cache.

Cache layout per layer: [num_kv_heads, num_blocks * block_size, head_dim]; the middle axis holds
"slots": a token at position p of a sequence lives in slot
block_table[p // block_size] * block_size + p % block_size. Heads come first so that the gathered
context of one head is contiguous and attention runs as plain batched matmuls (Paddle's CPU matmul
is several times slower on strided or broadcast operands).
"""

import functools

import paddle


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
    """In place. k, v: [T, num_kv_heads, head_dim]; slot_mapping: [T] int64 slot per token."""
    index = (_head_index(k_cache.shape[0], str(k_cache.place)), slot_mapping.unsqueeze(0))
    paddle.index_put_(k_cache, index, k.transpose([1, 0, 2]))
    paddle.index_put_(v_cache, index, v.transpose([1, 0, 2]))
