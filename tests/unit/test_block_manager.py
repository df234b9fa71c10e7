"""BlockManager: exact block counts, exclusive ownership, free list restored."""

from __future__ import annotations

import pytest

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.sequence import Sequence


def make_seq(rid: str, n_prompt: int) -> Sequence:
    return Sequence(rid, list(range(10, 10 + n_prompt)), SamplingParams(temperature=0.0), 16, [2])


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    held = [b for s in live for b in s.block_table]
    assert len(held) == len(set(held)), "a block is held by two live sequences"
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    assert bm.num_used_blocks == len(held)
    free = list(bm._free)
    assert len(free) == len(set(free)), "duplicate block on the free list"
    assert set(free).isdisjoint(held)
    assert all(bm.ref_counts[b] == 1 for b in held)
    assert all(bm.ref_counts[b] == 0 for b in free)


@pytest.mark.parametrize("num_tokens,expected", [(1, 1), (15, 1), (16, 1), (17, 2), (32, 2), (33, 3), (100, 7)])
def test_allocate_exact_block_count(num_tokens, expected):
    bm = BlockManager(16, 16)
    seq = make_seq("a", 4)
    assert bm.blocks_needed(seq, num_tokens) == expected
    bm.allocate(seq, num_tokens)
    assert len(seq.block_table) == expected
    assert bm.num_free_blocks == 16 - expected
    # Growing within the last block needs nothing; crossing a boundary needs exactly one more.
    assert bm.blocks_needed(seq, expected * 16) == 0
    assert bm.blocks_needed(seq, expected * 16 + 1) == 1
    bm.allocate(seq, expected * 16)
    assert len(seq.block_table) == expected


def test_incremental_growth_matches_one_shot():
    bm = BlockManager(32, 8)
    seq = make_seq("a", 4)
    for n in range(1, 100):
        bm.allocate(seq, n)
        assert len(seq.block_table) == -(-n // 8)
    assert bm.num_used_blocks == -(-99 // 8)


def test_free_restores_free_list_and_no_sharing():
    bm = BlockManager(10, 4)
    seqs = [make_seq(str(i), 4) for i in range(3)]
    for s, n in zip(seqs, (5, 9, 12)):
        bm.allocate(s, n)
    check_invariants(bm, seqs)
    assert bm.num_used_blocks == 2 + 3 + 3
    bm.free(seqs[1])
    assert seqs[1].block_table == []
    check_invariants(bm, [seqs[0], seqs[2]])
    assert bm.num_free_blocks == 5
    for s in (seqs[0], seqs[2]):
        bm.free(s)
    assert bm.num_free_blocks == 10 and bm.num_used_blocks == 0
    assert sorted(bm._free) == list(range(10))
    assert bm.ref_counts == [0] * 10


def test_exhaustion_raises_and_changes_nothing():
    bm = BlockManager(4, 16)
    a, b = make_seq("a", 4), make_seq("b", 4)
    bm.allocate(a, 48)
    assert not bm.can_allocate(bm.blocks_needed(b, 32))
    with pytest.raises(RuntimeError, match="exhausted"):
        bm.allocate(b, 32)
    assert b.block_table == [] and bm.num_free_blocks == 1
    check_invariants(bm, [a, b])


def test_double_free_is_harmless_after_table_cleared():
    bm = BlockManager(4, 16)
    a = make_seq("a", 4)
    bm.allocate(a, 40)
    bm.free(a)
    bm.free(a)  # table is empty now: nothing to release twice
    assert bm.num_free_blocks == 4


def test_rejects_zero_blocks():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 16)
