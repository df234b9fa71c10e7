"""Block sharing between the sequences of one request (n > 1): forked sequences share the prompt's
KV blocks, the last partial block is copied on write, full shared blocks never are, and no block
leaks. Block-manager level here; the engine level (same tokens as single requests with the derived
seeds) is in test_engine_tiny.py."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.sequence import Sequence
from paddle_llm_ops import copy_blocks

BS = 4


def seq(i: int, prompt: list[int]) -> Sequence:
    return Sequence("r", prompt, SamplingParams(temperature=1.0, seed=7), 8, [2], seq_index=i)


def prefilled(bm: BlockManager, n_prompt: int) -> Sequence:
    parent = seq(0, list(range(100, 100 + n_prompt)))
    assert bm.allocate_prompt(parent, 1000) == n_prompt
    parent.num_computed_tokens = n_prompt
    bm.commit_full_blocks(parent)
    return parent


def decode_one(bm: BlockManager, s: Sequence, token: int) -> None:
    """What the scheduler + engine do for one decode step of s: make its next slot writable."""
    s.append_token(token)
    bm.allocate(s, s.num_computed_tokens + 1)
    s.num_computed_tokens += 1
    bm.commit_full_blocks(s)


def assert_no_leak(bm: BlockManager, live: list[Sequence]) -> None:
    held: dict[int, int] = {}
    for s in live:
        for b in s.block_table:
            held[b] = held.get(b, 0) + 1
    assert all(bm.ref_counts[b] == n for b, n in held.items()), "reference count != holders"
    assert bm.num_used_blocks == len(held)
    assert set(bm._free).isdisjoint(held) and bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_fork_shares_the_prompt_and_copies_only_the_last_partial_block(prefix_caching):
    bm = BlockManager(32, BS, enable_prefix_caching=prefix_caching)
    parent = prefilled(bm, 3 * BS + 2)  # 3 full blocks + a partial one (2 of 4 slots)
    prompt_blocks = list(parent.block_table)
    children = [seq(i, parent.token_ids) for i in (1, 2)]
    for c in children:
        bm.fork(parent, c)
    fam = [parent] + children
    assert all(s.block_table == prompt_blocks for s in fam)
    assert all(bm.ref_counts[b] == 3 for b in prompt_blocks)
    assert bm.num_used_blocks == 4  # the prompt is stored once
    assert_no_leak(bm, fam)

    # each sequence writes its first own token into the shared partial block
    assert bm.blocks_needed(children[0], children[0].num_computed_tokens + 1) == 1  # one copy
    decode_one(bm, children[0], 501)
    assert bm.take_copies() == [(prompt_blocks[3], children[0].block_table[3])]
    decode_one(bm, children[1], 502)
    assert bm.take_copies() == [(prompt_blocks[3], children[1].block_table[3])]
    # the last holder writes the original block in place: no copy
    assert bm.blocks_needed(parent, parent.num_computed_tokens + 1) == 0
    decode_one(bm, parent, 500)
    assert bm.take_copies() == []
    assert parent.block_table[3] == prompt_blocks[3]
    # the 3 full blocks are still shared by all three, never copied
    assert all(s.block_table[:3] == prompt_blocks[:3] for s in fam)
    assert all(bm.ref_counts[b] == 3 for b in prompt_blocks[:3])
    assert len({s.block_table[3] for s in fam}) == 3
    assert bm.num_cow_copies == 2
    assert [c.num_new_blocks for c in children] == [1, 1] and parent.num_new_blocks == 4
    assert_no_leak(bm, fam)

    # grow past the block boundary: new private blocks, nothing copied
    for t in range(6):
        for s in fam:
            decode_one(bm, s, 600 + t)
    assert bm.take_copies() == []
    assert_no_leak(bm, fam)
    for s in fam:
        bm.free(s)
        assert_no_leak(bm, [x for x in fam if x.block_table])
    assert bm.num_free_blocks == bm.num_blocks and bm.ref_counts == [0] * bm.num_blocks


def test_block_aligned_prompt_needs_no_copy():
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    parent = prefilled(bm, 2 * BS)
    child = seq(1, parent.token_ids)
    bm.fork(parent, child)
    for s, tok in ((child, 7), (parent, 8)):
        decode_one(bm, s, tok)
    assert bm.take_copies() == [] and bm.num_cow_copies == 0
    assert child.block_table[:2] == parent.block_table[:2] and child.block_table[2] != parent.block_table[2]
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == bm.num_blocks


def test_preempted_copy_destination_is_dropped_and_freeing_keeps_sharers():
    bm = BlockManager(16, BS)
    parent = prefilled(bm, BS + 1)
    child = seq(1, parent.token_ids)
    bm.fork(parent, child)
    child.append_token(9)
    bm.allocate(child, child.num_computed_tokens + 1)  # queues a copy into a fresh block
    bm.free(child)  # preempted in the same schedule: the copy must not run into a free block
    assert bm.take_copies() == []
    assert all(bm.ref_counts[b] == 1 for b in parent.block_table)
    assert_no_leak(bm, [parent])
    bm.free(parent)
    assert bm.num_free_blocks == bm.num_blocks


def test_copy_blocks_op_copies_whole_blocks_in_every_layer():
    rng = np.random.default_rng(0)
    layers = [tuple(paddle.to_tensor(rng.standard_normal((2, 6 * BS, 3)).astype("float32")) for _ in range(2))
              for _ in range(3)]
    before = [[t.numpy().copy() for t in layer] for layer in layers]
    copy_blocks(layers, [(1, 4), (2, 5)], BS)
    for layer, old in zip(layers, before):
        for t, o in zip(layer, old):
            new = t.numpy()
            np.testing.assert_array_equal(new[:, 4 * BS:5 * BS], o[:, BS:2 * BS])
            np.testing.assert_array_equal(new[:, 5 * BS:6 * BS], o[:, 2 * BS:3 * BS])
            np.testing.assert_array_equal(new[:, :4 * BS], o[:, :4 * BS])
