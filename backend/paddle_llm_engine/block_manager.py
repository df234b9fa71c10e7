"""Paged KV cache bookkeeping: which blocks are free and which sequence holds which block.

Blocks are reference counted so that a later prefix cache can share full blocks between
sequences; a block returns to the free list only when its count drops to zero.
"""

from __future__ import annotations

from collections import deque

from paddle_llm_engine.sequence import Sequence


class BlockManager:
    """Owns `num_blocks` KV blocks of `block_size` tokens each. Never touches tensors."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so that its first `num_tokens` tokens have a slot."""
        need = -(-num_tokens // self.block_size)
        return max(0, need - len(seq.block_table))

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq.block_table to cover `num_tokens` tokens. Raises RuntimeError when short."""
        n = self.blocks_needed(seq, num_tokens)
        if n > len(self._free):
            raise RuntimeError(f"KV cache exhausted: need {n} blocks, {len(self._free)} free")
        for _ in range(n):
            b = self._free.popleft()
            assert self.ref_counts[b] == 0, f"block {b} on the free list is referenced"
            self.ref_counts[b] = 1
            seq.block_table.append(b)

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; blocks no one references go back to the free list."""
        for b in reversed(seq.block_table):
            self.ref_counts[b] -= 1
            assert self.ref_counts[b] >= 0, f"block {b} freed twice"
            if self.ref_counts[b] == 0:
                self._free.append(b)
        seq.block_table = []
