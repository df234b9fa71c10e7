"""Which part of the model a tensor-parallel rank holds, and the start-up check of the head counts.

- attention: query heads split evenly (tensor_parallel_size must divide num_attention_heads); KV
  heads split evenly when there are at least as many as ranks (the count must then be a multiple
  of the ranks), else replicated: each rank keeps the one KV head its query heads share (the
  ranks must then be a multiple of the KV heads). q/k/v are column-parallel (rows of HF's [out, in]
  tensors), o_proj row-parallel (its input columns) followed by an all_reduce.
- MLPs, dense, shared and every routed expert alike: gate/up column-parallel, down row-parallel,
  the intermediate dim split into N contiguous near-equal parts (the experts' routing is computed
  whole on every rank; the MoE block's output is summed by the same all_reduce as a dense MLP's).
- embedding and lm head: vocabulary rows split into ceil(V / N) per rank (the last rank may hold
  fewer); each rank's logits are its columns of the full row.
- biases of row-parallel projections are added once (rank 0; zeros elsewhere); norms, the router
  and the shared-expert gate are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass


def check_tensor_parallel(size: int, num_heads: int, num_kv_heads: int) -> None:
    """Raise ValueError naming both numbers when `size` ranks cannot split the attention."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    if num_heads % size:
        raise ValueError(f"tensor_parallel_size {size} does not divide the model's {num_heads} attention heads "
                         f"(num_attention_heads); use a divisor of {num_heads}")
    if num_kv_heads % size and size % num_kv_heads:
        raise ValueError(f"tensor_parallel_size {size} and the model's {num_kv_heads} KV heads "
                         f"(num_key_value_heads): one must be a multiple of the other")


def split(n: int, size: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank's part when n items are cut into `size` contiguous near-equal parts."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class ShardPlan:
    """What rank `rank` of `size` holds: query heads [q_start, q_start + num_heads), KV heads
    [kv_start, kv_start + num_kv_heads), vocabulary rows [vocab_start, vocab_end)."""

    rank: int
    size: int
    head_dim: int
    num_heads: int
    q_start: int
    num_kv_heads: int
    kv_start: int
    vocab_start: int
    vocab_end: int

    @classmethod
    def make(cls, rank: int, size: int, num_heads: int, num_kv_heads: int, head_dim: int,
             vocab_size: int) -> "ShardPlan":
        check_tensor_parallel(size, num_heads, num_kv_heads)
        nq = num_heads // size
        q_start = rank * nq
        if num_kv_heads >= size:
            nkv = num_kv_heads // size
            kv_start = rank * nkv
        else:  # replicated: the KV head of this rank's query heads (all share one)
            nkv = 1
            kv_start = q_start // (num_heads // num_kv_heads)
        per = -(-vocab_size // size)
        v0 = min(rank * per, vocab_size)
        return cls(rank, size, head_dim, nq, q_start, nkv, kv_start, v0, min(v0 + per, vocab_size))

    def q_rows(self) -> slice:
        return slice(self.q_start * self.head_dim, (self.q_start + self.num_heads) * self.head_dim)

    def kv_rows(self) -> slice:
        return slice(self.kv_start * self.head_dim, (self.kv_start + self.num_kv_heads) * self.head_dim)

    def part(self, n: int) -> slice:
        """This rank's part of an intermediate dim of n."""
        return slice(*split(n, self.size, self.rank))
