"""Paged KV cache bookkeeping: which blocks are free, which sequence holds which block, and the
prefix cache.

Prefix cache (as in vLLM's automatic prefix caching): a block that is full of computed tokens gets
a hash chained over its tokens and all tokens before it, so equal hashes mean equal prefixes. A new
sequence whose leading full blocks have known hashes takes those blocks instead of recomputing
them; shared blocks are reference counted and return to the free pool only when no live sequence
holds them. A free block keeps its hash (it is "cached") until it is handed out for new content,
least recently freed first; cached free blocks count as free.

Block sharing between the sequences of one request (num_return_sequences / n > 1): `fork` gives a
child sequence the parent's whole block table (reference counts + 1), so the prompt's KV is computed
and stored once. A block is written only at positions >= num_computed_tokens; before a sequence
writes into a block that another sequence also holds (the prompt's last, partial block), `allocate`
gives it a private copy (copy on write): a fresh block, the reference to the shared one dropped, and
a (source, destination) pair queued for the worker, which copies the KV before the step's writes
(`take_copies`). Full shared blocks are never written again, so they are never copied.
"""

from __future__ import annotations

from collections import OrderedDict

from paddle_llm_engine.sequence import Sequence


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given the hash of the block before it (None for the first)."""
    return hash((parent, tokens))


def first_parent(seq: Sequence) -> int | None:
    """The parent hash of a sequence's first block: None for the base model; for a LoRA sequence
    a value of its adapter's lora_id, so blocks computed with different adapters (different K/V for
    the same tokens) never match each other or the base model's."""
    return None if seq.lora is None else hash(("lora", seq.lora.lora_id))


class BlockManager:
    """Owns `num_blocks` KV blocks of `block_size` tokens each. Never touches tensors."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._block_hash: list[int | None] = [None] * num_blocks
        self._block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        self.prefix_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hit_tokens = 0    # of which found
        self._copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) pairs not yet taken
        self.num_cow_copies = 0       # blocks copied on write, since start
        # prefix-cache changes for KV-event publishing (kv_events.py), oldest first; None: not
        # recorded. ("stored", [hashes], parent hash or None, [token ids]) / ("removed", [hashes])
        self.events: list[tuple] | None = None

    def cached_hashes(self) -> set[int]:
        """The hashes of every block the prefix cache holds now (what KV events describe)."""
        return set(self._hash_to_block)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def prefix_cache_hit_ratio(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks `seq` needs so that its first `num_tokens` tokens have a slot it may write:
        new blocks past its table, plus a private copy of every shared block the write range
        [num_computed_tokens, num_tokens) touches (copy on write)."""
        need = -(-num_tokens // self.block_size)
        return max(0, need - len(seq.block_table)) + len(self._shared_in_write_range(seq, num_tokens))

    def _shared_in_write_range(self, seq: Sequence, num_tokens: int) -> list[int]:
        """Indices into seq.block_table of blocks that another sequence also holds and that this
        sequence will write when it computes its tokens up to `num_tokens`."""
        bs = self.block_size
        first = seq.num_computed_tokens // bs
        last = min(len(seq.block_table), -(-num_tokens // bs))
        return [i for i in range(first, last) if self.ref_counts[seq.block_table[i]] > 1]

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def _take_free(self) -> int:
        b, _ = self._free.popitem(last=False)  # least recently freed first: keeps hot prefixes
        h = self._block_hash[b]
        if h is not None:  # evict its cached content
            if self._hash_to_block.get(h) == b:
                del self._hash_to_block[h]
                if self.events is not None:
                    self.events.append(("removed", [h]))
            self._block_hash[b] = None
            self._block_tokens[b] = None
        return b

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Make `num_tokens` tokens of seq writable: copy the shared blocks it is about to write (the
        copies are queued for take_copies) and grow seq.block_table. Raises RuntimeError when short."""
        n = self.blocks_needed(seq, num_tokens)
        if n > len(self._free):
            raise RuntimeError(f"KV cache exhausted: need {n} blocks, {len(self._free)} free")
        for i in self._shared_in_write_range(seq, num_tokens):
            src, dst = seq.block_table[i], self._take_new()
            self.ref_counts[src] -= 1  # still > 0: the other holders keep the original
            seq.block_table[i] = dst
            seq.num_new_blocks += 1
            self._copies.append((src, dst))
            self.num_cow_copies += 1
        for _ in range(-(-num_tokens // self.block_size) - len(seq.block_table)):
            seq.block_table.append(self._take_new())
            seq.num_new_blocks += 1

    def _take_new(self) -> int:
        b = self._take_free()
        assert self.ref_counts[b] == 0, f"block {b} on the free list is referenced"
        self.ref_counts[b] = 1
        return b

    # -- block sharing -----------------------------------------------------------------------------
    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` (holding no blocks) shares every block of `parent` and its computed tokens; the
        first write into a shared block copies it (see allocate)."""
        assert not child.block_table, "fork into a sequence that holds blocks"
        for b in parent.block_table:
            self.ref_counts[b] += 1
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write (source block, destination block) pairs queued since the last call; the
        worker copies them before the step's KV writes."""
        out, self._copies = self._copies, []
        return out

    # -- prefix cache ------------------------------------------------------------------------------
    def _match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks for seq's leading full blocks. The last token is never covered: its
        logits are needed, so at least one token is always computed."""
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hits, parent = [], first_parent(seq)
        for i in range(max_blocks):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(parent, tokens)
            b = self._hash_to_block.get(h)
            if b is None or self._block_tokens[b] != tokens:
                break
            hits.append(b)
            parent = h
        return hits

    def allocate_prompt(self, seq: Sequence, budget: int) -> int | None:
        """Admit a sequence that holds no blocks: reuse cached prefix blocks, then allocate blocks
        for min(remaining tokens, budget) more. Sets seq.num_computed_tokens to the cached length.
        Returns the number of tokens to compute now, or None (nothing changed) when the free
        blocks do not suffice."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        hits = self._match_prefix(seq) if self.enable_prefix_caching else []
        cached = len(hits) * self.block_size
        n = min(seq.num_tokens - cached, budget)
        need = -(-(cached + n) // self.block_size) - len(hits)
        free_hits = sum(1 for b in hits if self.ref_counts[b] == 0)
        if need + free_hits > len(self._free):
            return None
        for b in hits:
            if self.ref_counts[b] == 0:
                del self._free[b]
            self.ref_counts[b] += 1
        seq.block_table = list(hits)
        seq.block_hashes = [self._block_hash[b] for b in hits]
        seq.num_computed_tokens = cached
        seq.num_reused_blocks += len(hits)
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = min(cached, seq.num_prompt_tokens)
        self.allocate(seq, cached + n)
        if self.enable_prefix_caching:
            self.prefix_query_tokens += seq.num_tokens
            self.prefix_hit_tokens += cached
        return n

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Register the hashes of blocks that became full of computed tokens (after a step)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = seq.num_computed_tokens // bs
        for i in range(len(seq.block_hashes), full):
            parent = seq.block_hashes[-1] if seq.block_hashes else first_parent(seq)
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(parent, tokens)
            seq.block_hashes.append(h)
            b = seq.block_table[i]
            if h not in self._hash_to_block and self._block_hash[b] is None:
                self._hash_to_block[h] = b
                self._block_hash[b] = h
                self._block_tokens[b] = tokens
                if self.events is not None:  # a first block's parent is the adapter's key, not a block
                    self._record_stored(h, parent if i else None, tokens,
                                        seq.lora.lora_id if seq.lora is not None else None)

    def _record_stored(self, h: int, parent: int | None, tokens: tuple[int, ...], lora_id: int | None = None) -> None:
        """A block joined the cache: extend the last "stored" event when it continues that chain
        (one event per run of blocks, as vLLM publishes them), else start one."""
        last = self.events[-1] if self.events else None
        if last is not None and last[0] == "stored" and last[1][-1] == parent:
            last[1].append(h)
            last[3].extend(tokens)
        else:
            self.events.append(("stored", [h], parent, list(tokens), lora_id))

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Drop the blocks of seq's table that lie wholly past its first `num_tokens` tokens
        (speculative rollback: blocks taken for rejected draft tokens). They hold no computed
        tokens, so they carry no prefix-cache hash."""
        keep = -(-num_tokens // self.block_size)
        while len(seq.block_table) > keep:
            b = seq.block_table.pop()
            self.ref_counts[b] -= 1
            assert self.ref_counts[b] >= 0, f"block {b} freed twice"
            if self.ref_counts[b] == 0:
                self._free[b] = None
                if self._copies:
                    self._copies = [(s, d) for s, d in self._copies if d != b]
        del seq.block_hashes[keep:]

    def free(self, seq: Sequence) -> None:
        """Drop seq's references; blocks no one references go back to the free pool (their cached
        content stays findable until the block is reused)."""
        released = set()
        for b in reversed(seq.block_table):
            self.ref_counts[b] -= 1
            assert self.ref_counts[b] >= 0, f"block {b} freed twice"
            if self.ref_counts[b] == 0:
                self._free[b] = None
                released.add(b)
        if released and self._copies:  # a copy into a block nobody holds any more is moot
            self._copies = [(s, d) for s, d in self._copies if d not in released]
        seq.block_table = []
        seq.block_hashes = []
