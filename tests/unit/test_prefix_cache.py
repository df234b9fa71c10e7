"""Prefix caching: reused blocks give the same tokens as a cold run, are reference counted, and
are counted in the hit ratio. Block size 16 on the tiny random Llama."""

from __future__ import annotations

import pytest

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.sequence import Sequence
from test_engine_tiny import BLOCK, greedy, make_engine, prompt, run


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    return (make_engine(tiny_model_dir, enable_prefix_caching=1),
            make_engine(tiny_model_dir, enable_prefix_caching=0))


def test_shared_prefix_same_tokens_and_hits(engines):
    cached, cold = engines
    system = prompt(3 * BLOCK + 5, salt=7)  # 3 full blocks shared, then a partial one
    reqs = {f"r{i}": (system + prompt(9 + i, salt=20 + i), greedy(12)) for i in range(4)}
    want = run(cold, reqs)
    first = run(cached, {"r0": reqs["r0"]})  # warms the cache
    assert first["r0"]["tokens"] == want["r0"]["tokens"]
    bm = cached.block_manager
    q0, h0 = bm.prefix_query_tokens, bm.prefix_hit_tokens
    rest = run(cached, {k: v for k, v in reqs.items() if k != "r0"})
    for rid, r in rest.items():
        assert r["tokens"] == want[rid]["tokens"], rid
    # each of the 3 later requests found the 3 shared full blocks, and says so (OpenAI's cached_tokens)
    assert bm.prefix_hit_tokens - h0 == 3 * 3 * BLOCK
    assert first["r0"]["cached"] == 0 and [r["cached"] for r in rest.values()] == [3 * BLOCK] * 3
    assert all(r["cached"] == 0 for r in run(cold, {"c": reqs["r1"]}).values())
    assert bm.prefix_query_tokens - q0 == sum(len(reqs[k][0]) for k in rest)
    assert cached.stats().prefix_cache_hit_ratio == pytest.approx(bm.prefix_hit_tokens / bm.prefix_query_tokens)


def test_identical_prompt_recomputes_last_token(engines):
    cached, cold = engines
    p = prompt(4 * BLOCK, salt=3)  # exactly 4 full blocks
    want = run(cold, {"a": (p, greedy(6))})["a"]["tokens"]
    run(cached, {"a": (p, greedy(6))})
    h0 = cached.block_manager.prefix_hit_tokens
    again = run(cached, {"a2": (p, greedy(6))})["a2"]["tokens"]
    assert again == want
    # the 4th block holds the last prompt token, whose logits are needed: only 3 blocks reused
    assert cached.block_manager.prefix_hit_tokens - h0 == 3 * BLOCK
    assert run(cached, {"a3": (p, greedy(2))})["a3"]["cached"] == 3 * BLOCK


def test_concurrent_sharers_hold_refcounts():
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    p = list(range(100, 113))  # 13 tokens: 3 full blocks + 1
    a = Sequence("a", p, SamplingParams(temperature=0), 4, [2])
    assert bm.allocate_prompt(a, 100) == 13
    a.num_computed_tokens = 13
    bm.commit_full_blocks(a)
    b = Sequence("b", p, SamplingParams(temperature=0), 4, [2])
    assert bm.allocate_prompt(b, 100) == 1  # 3 blocks cached, the last token recomputed
    shared = a.block_table[:3]
    assert b.block_table[:3] == shared and b.block_table[3] != a.block_table[3]
    assert all(bm.ref_counts[x] == 2 for x in shared)
    bm.free(a)
    assert all(bm.ref_counts[x] == 1 for x in shared)
    assert bm.num_used_blocks == 4  # b's blocks only
    bm.free(b)
    assert bm.num_free_blocks == 16
    # freed blocks stay findable until reused
    c = Sequence("c", p, SamplingParams(temperature=0), 4, [2])
    assert bm.allocate_prompt(c, 100) == 1 and c.block_table[:3] == shared


def test_cached_free_blocks_are_evicted_when_needed():
    bm = BlockManager(4, 4, enable_prefix_caching=True)
    a = Sequence("a", list(range(100, 109)), SamplingParams(temperature=0), 4, [2])
    bm.allocate_prompt(a, 100)
    a.num_computed_tokens = 9
    bm.commit_full_blocks(a)
    bm.free(a)
    other = Sequence("o", list(range(500, 516)), SamplingParams(temperature=0), 4, [2])
    assert bm.allocate_prompt(other, 100) == 16  # needs all 4 blocks: cached ones are reused
    assert bm.num_free_blocks == 0
    bm.free(other)
    again = Sequence("a2", list(range(100, 109)), SamplingParams(temperature=0), 4, [2])
    assert bm.allocate_prompt(again, 100) == 9  # cache was evicted: nothing reused
