"""Write the new keys and values of a step into the paged KV cache.

Cache layout per layer: [num_blocks * block_size, num_kv_heads, head_dim] ("slots"); a token at
position p of a sequence lives in slot block_table[p // block_size] * block_size + p % block_size.
"""

import paddle


def write_kv(
    k_cache: paddle.Tensor,
    v_cache: paddle.Tensor,
    k: paddle.Tensor,
    v: paddle.Tensor,
    slot_mapping: paddle.Tensor,
) -> None:
    """In place. k, v: [T, num_kv_heads, head_dim]; slot_mapping: [T] int64 slot per token."""
    k_cache.scatter_(slot_mapping, k, overwrite=True)
    v_cache.scatter_(slot_mapping, v, overwrite=True)
