"""Per-request sampling and stopping through LLMEngine on the tiny random Llama, checked against a
numpy reference applied to the raw logits the engine returns (step(return_logits=True)):
penalties and bad words decide every greedy token; logprobs are log_softmax of the raw logits;
stop ids, min_tokens and ignore_eos end requests where they should; and requests with different
parameters in one batch give exactly what each gives alone."""

from __future__ import annotations

import numpy as np
import pytest

from test_engine_tiny import make_engine, prompt, run
from test_sampling_reference import ref_bad_words, ref_log_softmax, ref_presence_frequency, ref_repetition

from paddle_llm_engine import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = make_engine(tiny_model_dir)
    yield eng
    for rid in list(eng.requests):
        eng.abort_request(rid)


def greedy(n: int, **kw) -> SamplingParams:
    kw.setdefault("ignore_eos", True)
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


def check_greedy_against_reference(res: dict, ids: list[int], process) -> None:
    """Each token == argmax(process(raw logits, history)), history = prompt + earlier outputs."""
    toks = res["tokens"]
    assert len(res["logits"]) == len(toks)
    for k, (tok, raw) in enumerate(zip(toks, res["logits"])):
        ref = process(raw, ids + toks[:k], toks[:k])
        assert tok == int(np.argmax(ref)), f"token {k}: got {tok}, reference {int(np.argmax(ref))}"


@pytest.fixture(scope="module")
def looping_engine(tiny_model_dir, tmp_path_factory):
    """A tiny Llama with tied embeddings: its hidden state stays close to the input token's
    embedding, so greedy decoding repeats tokens (often a prompt token) and penalties bite."""
    from tiny_model import make_tiny_llama

    # tokenizer files from the untied tiny model's folder (copies of SmolLM2's)
    d = make_tiny_llama(tmp_path_factory.mktemp("tiny_tied"), tiny_model_dir, tie_word_embeddings=True)
    return make_engine(str(d))


@pytest.mark.parametrize("kw", [
    dict(repetition_penalty=1.8),
    dict(repetition_penalty=1.1),
    dict(repetition_penalty=0.6),
    dict(presence_penalty=1.5, frequency_penalty=0.7),
    dict(frequency_penalty=0.3),
    dict(presence_penalty=0.5),
    dict(repetition_penalty=1.4, presence_penalty=0.8, frequency_penalty=0.4),
])
def test_penalties_decide_greedy_tokens_as_reference(looping_engine, kw):
    ids = prompt(12, salt=301)
    base = run(looping_engine, {"b": (ids, greedy(24))})["b"]["tokens"]
    assert len(set(base)) < 6, "test design: the tied model should loop"
    res = run(looping_engine, {"p": (ids, greedy(24, **kw))}, return_logits=True)["p"]
    rp = kw.get("repetition_penalty", 1.0)
    pp, fp = kw.get("presence_penalty", 0.0), kw.get("frequency_penalty", 0.0)
    check_greedy_against_reference(
        res, ids, lambda raw, hist, out: ref_presence_frequency(ref_repetition(raw, hist, rp), out, pp, fp))
    assert res["tokens"] != base, "the penalty changed nothing: the check would be vacuous"


def test_repetition_penalty_counts_prompt_tokens_presence_does_not(looping_engine):
    """This prompt's greedy continuation repeats one of its own tokens from the first step: the
    repetition penalty (prompt + output) changes that first token, presence / frequency (output
    only) cannot."""
    ids = prompt(12, salt=300)
    base = run(looping_engine, {"b": (ids, greedy(8))})["b"]["tokens"]
    assert base[0] in ids, "test design: the first token should come from the prompt"
    rep = run(looping_engine, {"r": (ids, greedy(8, repetition_penalty=1.8))})["r"]["tokens"]
    pres = run(looping_engine, {"p": (ids, greedy(8, presence_penalty=2.0, frequency_penalty=2.0))})["p"]["tokens"]
    assert rep[0] != base[0]
    assert pres[0] == base[0]


def _round_trip_span(tok, base: list[int], n: int) -> int | None:
    """Index of the first n consecutive tokens of base (after the first) whose decoded text encodes
    back to exactly them, so that the word given as text is banned as those tokens."""
    for i in range(1, len(base) - n):
        span = base[i:i + n]
        text = tok.decode(span)
        if text.strip() and list(tok.encode(text, add_special_tokens=False)) == span:
            return i
    return None


def test_bad_words_single_and_multi_token_through_tokenizer(engine):
    ids = prompt(10, salt=310)
    base = run(engine, {"b": (ids, greedy(30))})["b"]["tokens"]
    tok = engine.tokenizer
    i1, i2 = _round_trip_span(tok, base, 1), _round_trip_span(tok, base, 2)
    assert i1 is not None and i2 is not None, "test design: no round-trip tokens in the baseline"
    one, two = base[i1:i1 + 1], base[i2:i2 + 2]
    for words, first_change in (([one], i1), ([two], i2 + 1), ([one, two], min(i1, i2 + 1))):
        res = run(engine, {"w": (ids, greedy(30, bad_words=[tok.decode(w) for w in words]))},
                  return_logits=True)["w"]
        out = res["tokens"]
        # identical up to the first banned position, different there
        assert out[:first_change] == base[:first_change] and out[first_change] != base[first_change], words
        if one in words:
            assert one[0] not in out
        if two in words:
            assert all(out[i:i + 2] != two for i in range(len(out) - 1))
        check_greedy_against_reference(res, ids, lambda raw, hist, _: ref_bad_words(raw, hist, words))


def test_logprobs_match_log_softmax_of_raw_logits(engine):
    ids = prompt(9, salt=320)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=5, repetition_penalty=1.2, logprobs=5,
                            max_tokens=16, ignore_eos=True)
    eng_out = []
    engine.add_request("lp", ids, params)
    while engine.has_unfinished_requests():
        eng_out += engine.step(return_logits=True)
    total = 0.0
    for out in eng_out:
        assert len(out.token_ids) == 1 and len(out.logprobs) == 1
        ref = ref_log_softmax(out.logits)
        lp, top = out.logprobs[0]
        assert abs(lp - ref[out.token_ids[0]]) < 1e-5
        assert [t for t, _ in top] == np.argsort(-ref)[:5].tolist()
        assert all(abs(v - ref[t]) < 1e-5 for t, v in top)
        total += ref[out.token_ids[0]]
        assert abs(out.cumulative_logprob - total) < 1e-4
    assert len(eng_out) == 16


def test_stop_token_ids_and_min_tokens(engine):
    ids = prompt(10, salt=330)
    base = run(engine, {"b": (ids, greedy(24))})["b"]["tokens"]
    stop = base[6]
    first = base.index(stop)
    res = run(engine, {"s": (ids, greedy(24, stop_token_ids=[stop]))})["s"]
    assert res["reason"] == "stop" and res["tokens"] == base[:first + 1]
    # stop ids end generation even with ignore_eos (set by greedy()); they are not EOS
    # min_tokens: the stop id is suppressed (not just ignored) until min_tokens outputs exist
    late = run(engine, {"s": (ids, greedy(24, stop_token_ids=[stop], min_tokens=first + 2))})["s"]
    assert late["tokens"][:first] == base[:first]
    assert stop not in late["tokens"][:first + 2]
    assert len(late["tokens"]) >= first + 2
    if late["reason"] == "stop":
        assert late["tokens"][-1] == stop
    else:
        assert late["reason"] == "length" and len(late["tokens"]) == 24


def test_ignore_eos_runs_to_max_tokens(engine):
    ids = prompt(10, salt=340)
    base = run(engine, {"b": (ids, greedy(20))})["b"]["tokens"]
    eos = base[3]
    stopped = run(engine, {"e": (ids, greedy(20, eos_token_ids=[eos], ignore_eos=False))})["e"]
    assert stopped["reason"] == "stop" and stopped["tokens"] == base[:base.index(eos) + 1]
    kept = run(engine, {"e": (ids, greedy(20, eos_token_ids=[eos], ignore_eos=True))})["e"]
    assert kept["reason"] == "length" and kept["tokens"] == base


def test_requests_with_different_parameters_do_not_affect_each_other(engine):
    """Alone vs together in one batch: tokens, finish reasons, text and logprobs are identical.
    A, B and C share one prompt (so one greedy baseline): A stops on a stop id at position 5, B on an
    EOS id at position 9, C has neither and runs to max_tokens; each one's stop must not end the
    others (no per-request value in a shared slot). D and E sample with their own seeds, penalties,
    filters, bad words and logprobs."""
    shared = prompt(11, salt=350)
    ids = {"A": shared, "B": shared, "C": shared, "D": prompt(7, salt=351), "E": prompt(23, salt=352)}
    base = run(engine, {"b": (shared, greedy(20))})["b"]["tokens"]
    stop_a, eos_b = base[5], base[9]
    assert stop_a not in base[:5] and eos_b not in base[:9] and stop_a != eos_b, "test design: pick other positions"
    params = {
        "A": lambda: SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop_a], eos_token_ids=[0]),
        "B": lambda: SamplingParams(temperature=0.0, max_tokens=20, eos_token_ids=[eos_b]),
        "C": lambda: SamplingParams(temperature=0.0, max_tokens=20, eos_token_ids=[0]),
        "D": lambda: SamplingParams(temperature=0.9, top_p=0.95, seed=1, max_tokens=20, ignore_eos=True,
                                    repetition_penalty=1.5, presence_penalty=0.5, logprobs=3),
        "E": lambda: SamplingParams(temperature=1.1, top_k=30, min_p=0.02, seed=2, max_tokens=20, ignore_eos=True,
                                    frequency_penalty=0.7, bad_words=[engine.tokenizer.decode([base[2]])],
                                    logprobs=2),
    }

    def collect(requests):
        res = {k: {"tokens": [], "reason": None, "text": "", "lps": []} for k in requests}
        for k, (v, sp) in requests.items():
            engine.add_request(k, v, sp)
        while engine.has_unfinished_requests():
            for out in engine.step():
                r = res[out.request_id]
                r["tokens"] += out.token_ids
                r["text"] += out.text
                r["lps"] += out.logprobs
                if out.finished:
                    r["reason"] = out.finish_reason
        return res

    alone = {k: collect({k: (ids[k], params[k]())})[k] for k in ids}
    together = collect({k: (ids[k], params[k]()) for k in ids})
    assert alone["A"]["reason"] == "stop" and alone["A"]["tokens"] == base[:6]
    assert alone["B"]["reason"] == "stop" and alone["B"]["tokens"] == base[:10]
    assert alone["C"]["reason"] == "length" and alone["C"]["tokens"] == base
    for k in "DE":
        assert alone[k]["reason"] == "length" and len(alone[k]["tokens"]) == 20
    assert len(set(alone["D"]["tokens"])) > 5 and len(set(alone["E"]["tokens"])) > 5  # really sampled
    for k in ids:
        a, t = alone[k], together[k]
        assert t["tokens"] == a["tokens"], k
        assert t["reason"] == a["reason"] and t["text"] == a["text"], k
        assert len(t["lps"]) == len(a["lps"]) == len(a["tokens"])
        for (la, ta), (lt, tt) in zip(a["lps"], t["lps"]):
            assert abs(la - lt) < 1e-3 and [x for x, _ in ta] == [x for x, _ in tt], k
