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


# -- engine level: n sequences of one request on the tiny random Llama -----------------------------

def _run_n(engine, rid: str, ids: list[int], params: SamplingParams) -> dict[int, dict]:
    """Submit one request, step to completion; per sequence index: tokens, text, reason."""
    res: dict[int, dict] = {}
    engine.add_request(rid, ids, params)
    finished = False
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert not finished, "output after the request finished"
            r = res.setdefault(out.sequence_index, {"tokens": [], "text": "", "reason": None})
            assert r["reason"] is None, "output after its sequence finished"
            r["tokens"] += out.token_ids
            r["text"] += out.text
            if out.sequence_finished:
                r["reason"] = out.finish_reason
            finished = out.finished
    assert finished
    return res


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from test_engine_tiny import make_engine

    return make_engine(tiny_model_dir, enable_prefix_caching=1)


def test_n_sequences_sample_like_single_requests_with_derived_seeds(engine):
    from test_engine_tiny import BLOCK, prompt

    ids = prompt(2 * BLOCK + 5, salt=11)  # 2 full blocks + a partial one
    sp = lambda seed, n=1: SamplingParams(temperature=1.0, top_k=50, seed=seed, n=n, max_tokens=24, ignore_eos=True)
    bm = engine.block_manager
    copies0, used0 = bm.num_cow_copies, bm.num_used_blocks
    got = _run_n(engine, "n3", ids, sp(1234, n=3))
    assert sorted(got) == [0, 1, 2] and all(r["reason"] == "length" for r in got.values())
    assert all(len(r["tokens"]) == 24 for r in got.values())
    # the partial prompt block was copied by 2 of its 3 holders; the 2 full ones never
    assert bm.num_cow_copies - copies0 == 2
    assert bm.num_used_blocks == used0 == 0, "KV blocks leaked"
    for i in range(3):  # sequence i samples exactly as a request with seed 1234 + i
        alone = _run_n(engine, f"alone{i}", ids, sp(1234 + i))[0]
        assert alone["tokens"] == got[i]["tokens"], f"sequence {i}"
    assert len({tuple(r["tokens"]) for r in got.values()}) == 3
    assert _run_n(engine, "again", ids, sp(1234, n=3)) == got  # deterministic


def test_n_greedy_and_abort_free_everything(engine):
    from test_engine_tiny import BLOCK, greedy, prompt

    ids = prompt(BLOCK + 3, salt=12)
    one = _run_n(engine, "g1", ids, greedy(10))[0]
    two = _run_n(engine, "g2", ids, greedy(10, n=2))
    assert two[0]["tokens"] == two[1]["tokens"] == one["tokens"]
    engine.add_request("ab", ids, greedy(50, n=4))
    for _ in range(3):
        engine.step()
    assert len(engine.scheduler.running) == 4
    out = engine.abort_request("ab")
    assert out.finished and out.finish_reason == "abort"
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished_requests()
    engine.add_request("ab0", ids, greedy(50, n=3))  # aborted before the fork
    assert engine.abort_request("ab0").finished
    assert engine.block_manager.num_used_blocks == 0 and not engine.scheduler.running


def test_request_perf_counters(engine):
    from test_engine_tiny import BLOCK, greedy, prompt

    ids = prompt(3 * BLOCK + 4, salt=13)
    outs = []
    for rid in ("p1", "p2"):
        engine.add_request(rid, ids, greedy(3))
        while engine.has_unfinished_requests():
            outs += [o for o in engine.step() if o.finished]
    first, second = outs
    assert first.num_reused_blocks == 0 and first.num_new_blocks == 4
    assert second.num_reused_blocks == 3 and second.num_new_blocks == 1  # the prefix cache hit
    for o in outs:
        assert o.arrival_time <= o.first_scheduled_time <= o.first_token_time <= o.last_token_time
