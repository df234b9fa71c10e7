"""LLMEngine end to end on a tiny random Llama (tests/support/tiny_model.py): preemption with
recompute, chunked prefill, abort, stop strings, EOS handling, seeded sampling in a batch, and the
offline LLM wrapper. Exact-token comparisons rely on the tiny model's well-separated logits."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_llm_engine import LLM, EngineConfig, ErrorCode, InvalidRequestError, LLMEngine, SamplingParams

BLOCK = 16
MAX_LEN = 128


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens, **kw)


def prompt(n: int, salt: int = 0) -> list[int]:
    rng = np.random.default_rng(1000 + salt)
    return rng.integers(100, 40000, size=n).tolist()


def make_engine(model_dir: str, **kw) -> LLMEngine:
    cfg = dict(model_dir=model_dir, device="cpu", block_size=BLOCK, num_kv_blocks=64, max_model_len=MAX_LEN,
               max_num_seqs=8, max_num_batched_tokens=512, num_threads=2)
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]], return_logits=False,
        max_steps: int = 10_000):
    """Submit all, step to completion. Returns {rid: dict(tokens, text, reason, logits, preemptions)}."""
    res = {rid: {"tokens": [], "text": "", "reason": None, "logits": [], "preemptions": 0, "cached": 0}
           for rid in requests}
    for rid, (ids, sp) in requests.items():
        engine.add_request(rid, ids, sp)
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step(return_logits=return_logits):
            r = res[out.request_id]
            r["tokens"] += out.token_ids
            r["text"] += out.text
            r["preemptions"] = max(r["preemptions"], out.num_preemptions)
            r["cached"] = out.num_cached_tokens
            if return_logits:
                r["logits"].append(out.logits)
            if out.finished:
                r["reason"] = out.finish_reason
    assert not engine.has_unfinished_requests(), "engine did not finish within max_steps"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "KV blocks leaked"
    return res


@pytest.fixture(scope="module")
def shared_engine(tiny_model_dir):
    return make_engine(tiny_model_dir)


@pytest.fixture
def engine(shared_engine):
    """The module's engine, emptied after each test so one failure does not cascade."""
    yield shared_engine
    for rid in list(shared_engine.requests):
        shared_engine.abort_request(rid)


def test_preemption_recomputes_and_gives_same_greedy_tokens(engine, tiny_model_dir):
    reqs = {f"p{i}": (prompt(30 + 7 * i, salt=i), greedy(60)) for i in range(3)}
    alone = {rid: run(engine, {rid: r})[rid]["tokens"] for rid, r in reqs.items()}
    # 10 blocks of 16 tokens: each sequence grows to 90+ tokens (6+ blocks), so three cannot all fit.
    small = make_engine(tiny_model_dir, num_kv_blocks=10)
    res = run(small, reqs)
    assert small.scheduler.num_preemptions > 0
    assert any(r["preemptions"] > 0 for r in res.values())
    for rid in reqs:
        assert res[rid]["reason"] == "length"
        assert res[rid]["tokens"] == alone[rid], f"{rid} changed after preemption"


def test_chunked_prefill_matches_one_shot(engine, tiny_model_dir):
    reqs = {f"c{i}": (prompt(n, salt=10 + i), greedy(12)) for i, n in enumerate((5, 40, 97))}
    full = run(engine, reqs, return_logits=True)
    chunked_engine = make_engine(tiny_model_dir, max_num_batched_tokens=16)
    chunked = run(chunked_engine, reqs, return_logits=True)
    for rid in reqs:
        assert chunked[rid]["tokens"] == full[rid]["tokens"]
        diff = max(float(np.abs(a - b).max()) for a, b in zip(chunked[rid]["logits"], full[rid]["logits"]))
        assert diff < 1e-3, f"{rid}: logits differ by {diff}"
    assert chunked_engine.num_steps > 97 // 16


def test_batched_equals_alone(engine):
    # Lengths around block boundaries, and a 1-token prompt (packed like a decode).
    reqs = {f"b{i}": (prompt(n, salt=20 + i), greedy(10 + i)) for i, n in enumerate((1, 3, 16, 17, 33, 64))}
    alone = {rid: run(engine, {rid: r})[rid]["tokens"] for rid, r in reqs.items()}
    together = run(engine, reqs)
    assert {rid: r["tokens"] for rid, r in together.items()} == alone


def test_one_token_chunks_next_to_decodes(engine, tiny_model_dir):
    """Budget 4 with 3 decoding sequences: the long prompt advances one token per step, so its
    non-final 1-token chunks are packed among the decodes."""
    reqs = {"d0": (prompt(3, salt=80), greedy(30)), "d1": (prompt(2, salt=81), greedy(30)),
            "d2": (prompt(4, salt=82), greedy(30)), "long": (prompt(21, salt=83), greedy(6))}
    alone = {rid: run(engine, {rid: r})[rid]["tokens"] for rid, r in reqs.items()}
    tight = make_engine(tiny_model_dir, max_num_batched_tokens=4, max_num_seqs=4)
    res = run(tight, reqs)
    assert {rid: r["tokens"] for rid, r in res.items()} == alone
    assert tight.num_steps >= 21


def test_seeded_sampling_independent_of_batch(engine):
    sp = lambda: SamplingParams(temperature=1.0, top_p=0.95, seed=42, max_tokens=16, ignore_eos=True)  # noqa: E731
    target = (prompt(12, salt=30), sp())
    alone = run(engine, {"t": target})["t"]["tokens"]
    mates = {f"m{i}": (prompt(5 + 9 * i, salt=31 + i), SamplingParams(temperature=0.9, seed=i, max_tokens=8 + i))
             for i in range(4)}
    together = run(engine, {**mates, "t": (target[0], sp())})
    assert together["t"]["tokens"] == alone
    again = run(engine, {"t": (target[0], sp())})["t"]["tokens"]
    assert again == alone


def test_abort_frees_blocks_and_reports(engine):
    engine.add_request("a1", prompt(50, salt=40), greedy(40))
    engine.add_request("a2", prompt(20, salt=41), greedy(40))
    for _ in range(3):
        engine.step()
    assert engine.block_manager.num_used_blocks > 0
    out = engine.abort_request("a1")
    assert out.finished and out.finish_reason == "abort"
    assert engine.abort_request("a1") is None
    engine.abort_request("a2")
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert engine.step() == []


def test_eos_stops_unless_ignored(engine):
    ids = prompt(10, salt=50)
    base = run(engine, {"e": (ids, greedy(20))})["e"]["tokens"]
    eos = base[5]
    first = base.index(eos)
    stopped = run(engine, {"e": (ids, SamplingParams(temperature=0.0, max_tokens=20, eos_token_ids=[eos]))})["e"]
    assert stopped["reason"] == "stop" and stopped["tokens"] == base[:first + 1]
    ignored = run(engine, {"e": (ids, greedy(20, eos_token_ids=[eos]))})["e"]
    assert ignored["reason"] == "length" and ignored["tokens"] == base
    # min_tokens: the EOS cannot come before 8 outputs exist.
    late = run(engine, {"e": (ids, SamplingParams(temperature=0.0, max_tokens=20, eos_token_ids=[eos],
                                                   min_tokens=first + 2))})["e"]
    assert len(late["tokens"]) >= first + 2
    assert late["tokens"][:first] == base[:first] and late["tokens"][first] != eos


def test_stop_string_cuts_text(engine):
    ids = prompt(8, salt=60)
    base = run(engine, {"s": (ids, greedy(24))})["s"]
    text = base["text"]
    assert len(text) > 10
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = text.index(stop)
    res = run(engine, {"s": (ids, greedy(24, stop=[stop]))})["s"]
    assert res["reason"] == "stop"
    assert res["text"] == text[:cut]
    assert stop not in res["text"]


def test_invalid_requests_rejected(engine):
    """The engine names fields in its own terms, with an ErrorCode (the contracts rename the prompt
    text_input, its ids input_ids: test_input_edges.py, test_contracts.py)."""
    with pytest.raises(InvalidRequestError) as ei:
        engine.add_request("x", [], greedy(4))
    assert (ei.value.field, ei.value.code) == ("prompt", ErrorCode.PROMPT_EMPTY)
    with pytest.raises(InvalidRequestError) as ei:
        engine.add_request("x", prompt(MAX_LEN), greedy(4))
    assert (ei.value.field, ei.value.code) == ("prompt", ErrorCode.PROMPT_TOO_LONG)
    with pytest.raises(InvalidRequestError) as ei:
        engine.add_request("x", prompt(MAX_LEN - 4), greedy(10))
    assert (ei.value.field, ei.value.code) == ("max_tokens", ErrorCode.MAX_TOKENS_TOO_LARGE)
    with pytest.raises(InvalidRequestError) as ei:
        engine.add_request("x", prompt(4), SamplingParams(top_p=2.0))
    assert ei.value.field == "top_p"
    vocab = engine.model_config.vocab_size
    for bad in (vocab, -1):  # would fail the model's embedding lookup, and so the whole step
        with pytest.raises(InvalidRequestError) as ei:
            engine.add_request("x", prompt(4) + [bad], greedy(4))
        assert ei.value.field == "prompt_token_ids" and str(bad) in str(ei.value)
        assert ei.value.code is ErrorCode.TOKEN_OUT_OF_VOCABULARY
    assert not engine.has_unfinished_requests()


def test_llm_generate(tiny_model_dir):
    llm = LLM(tiny_model_dir, device="cpu", block_size=BLOCK, num_kv_blocks=32, max_model_len=MAX_LEN)
    outs = llm.generate(["Hello there", prompt(9, salt=70)], SamplingParams(temperature=0.0, max_tokens=6,
                                                                            ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [6, 6]
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[1].prompt_token_ids == prompt(9, salt=70)
