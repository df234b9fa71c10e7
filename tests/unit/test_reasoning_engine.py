"""The engine on tiny thinking models (tests/support/thinking_checkpoints.py): the thinking budget
(exactly N chosen tokens, then the family's end sequence, then the answer), the split of every output
into reasoning and answer, guided decoding that starts after the thinking, n > 1, prefix-cache hits,
speculative decoding, prompts whose template closed the thinking, and the refusals.

A random model does not think: logit_bias / allowed_token_ids steer it (the end marker pushed out of
reach so that only the budget ends the thinking, or pushed to the top so that the model ends it at
once); the expected split is computed from the token ids with the tokenizer and str operations
(reference_split, tests/support/reasoning_reference.py), not by the engine's parser."""

from __future__ import annotations

import json

import pytest

from reasoning_reference import reference_split
from thinking_checkpoints import make_thinking_checkpoint

from test_engine_tiny import make_engine

from paddle_llm_engine import InvalidRequestError, SamplingParams
from paddle_llm_engine.guided import GuideSpec
from paddle_llm_engine.tokenizer import encode_prompt

ASCII = [10] + list(range(32, 127))  # byte-level ids of "\n" and the printable ASCII bytes
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    out = {}
    for fam in ("qwen3", "ernie45", "deepseek_r1"):
        d = str(make_thinking_checkpoint(fam, tmp_path_factory.mktemp(fam)))
        out[fam] = make_engine(d, max_model_len=256)
    return out


def run(engine, reqs: dict) -> dict:
    """Submit {rid: (prompt ids, params)}, step to the end; per rid and sequence: ids, text, reasoning
    and content joined from the outputs, the last output."""
    res = {}
    for rid, (ids, sp) in reqs.items():
        engine.add_request(rid, ids, sp)
    while engine.has_unfinished_requests():
        for out in engine.step():
            r = res.setdefault((out.request_id, out.sequence_index),
                               {"ids": [], "text": "", "reasoning": "", "content": "", "last": None, "splits": 0})
            r["ids"] += out.token_ids
            r["text"] += out.text
            if out.reasoning_text is not None:
                r["splits"] += 1
                r["reasoning"] += out.reasoning_text
                r["content"] += out.content_text
            r["last"] = out
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return res


def _setup(engine):
    tok = engine.tokenizer
    parser = engine.reasoning.default
    return tok, parser, encode_prompt(tok, "What is 2+2? Think first.", chat=True)


def check_budgeted(engine, r, budget: int, thinking_at_start: bool = True):
    """ids: `budget` chosen tokens (no end marker among them), the end sequence, the answer; the
    split equal to the reference split of the decoded text; the reasoning token count."""
    tok, parser, _ = _setup(engine)
    ids, seq = r["ids"], parser.end_sequence
    assert parser.end_id not in ids[:budget]
    assert tuple(ids[budget:budget + len(seq)]) == seq
    text = tok.decode(ids, skip_special_tokens=False)
    assert r["text"] == text.replace(tok.eos_token, "") if tok.eos_token else text
    assert (r["reasoning"], r["content"]) == reference_split(r["text"], thinking_at_start, parser.drop_tags)
    assert r["reasoning"] == tok.decode(ids[:budget], skip_special_tokens=False) + "\n"
    assert r["last"].num_reasoning_tokens == budget + seq.index(parser.end_id) + 1


@pytest.mark.parametrize("family", ["qwen3", "ernie45", "deepseek_r1"])
@pytest.mark.parametrize("budget", [0, 1, 7])
def test_budget_gives_exactly_n_thinking_tokens_then_the_end_sequence(engines, family, budget):
    engine = engines[family]
    tok, parser, prompt = _setup(engine)
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, reasoning_max_tokens=budget,
                        allowed_token_ids=ASCII + [parser.end_id], logit_bias={parser.end_id: -100.0})
    r = run(engine, {"a": (prompt, sp)})[("a", 0)]
    check_budgeted(engine, r, budget)
    assert r["content"] and r["splits"] == len(r["ids"])  # every output carries its split
    # thinking_token_budget is the same parameter (contracts map both names onto it): a larger budget
    # gives the same first `budget` tokens, more of them before the end sequence
    more = run(engine, {"b": (prompt, SamplingParams(**{**sp.__dict__, "reasoning_max_tokens": budget + 3}))})
    assert more[("b", 0)]["ids"][:budget] == r["ids"][:budget]
    check_budgeted(engine, more[("b", 0)], budget + 3)


def test_the_model_ending_its_thinking_itself_is_not_forced(engines):
    engine = engines["qwen3"]
    tok, parser, prompt = _setup(engine)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, reasoning_max_tokens=50,
                        logit_bias={parser.end_id: 100.0})
    r = run(engine, {"a": (prompt, sp)})[("a", 0)]
    assert r["ids"] == [parser.end_id] * 6  # chosen, not the forced "\n</think>\n\n"
    assert (r["reasoning"], r["content"]) == ("", "</think>" * 5)  # later markers are answer text
    assert r["last"].num_reasoning_tokens == 1


def test_a_template_that_closed_the_thinking_gives_all_answer(engines):
    engine = engines["qwen3"]
    tok, parser, _ = _setup(engine)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
                                  enable_thinking=False)
    ids = [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, reasoning_max_tokens=0,
                        allowed_token_ids=ASCII)
    r = run(engine, {"a": (ids, sp)})[("a", 0)]
    assert parser.end_id not in r["ids"] and (r["reasoning"], r["content"]) == ("", r["text"])
    assert r["last"].num_reasoning_tokens == 0


@pytest.mark.parametrize("family", ["qwen3", "ernie45"])
def test_guided_json_applies_to_the_answer_only(engines, family):
    engine = engines[family]
    tok, parser, prompt = _setup(engine)
    guide = GuideSpec("json_schema", json.dumps(SCHEMA), field="structured_outputs", whitespace_flexible=False)
    sp = SamplingParams(temperature=0, max_tokens=40, reasoning_max_tokens=5, guide=guide,
                        logit_bias={parser.end_id: -100.0})
    r = run(engine, {"g": (prompt, sp)})[("g", 0)]
    ids = r["ids"]
    assert tuple(ids[5:5 + len(parser.end_sequence)]) == parser.end_sequence
    value = json.loads(r["content"])
    assert set(value) == {"a"} and 0 <= value["a"] <= 99
    assert r["last"].finish_reason == "stop"  # the guide completed
    # the 5 thinking tokens are the unguided model's: the same as without a guide
    free = run(engine, {"f": (prompt, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                                     logit_bias={parser.end_id: -100.0}))})[("f", 0)]
    assert ids[:5] == free["ids"]


def test_n_sequences_and_prefix_cache_hits_keep_each_sequences_budget(engines):
    engine = engines["deepseek_r1"]
    tok, parser, prompt = _setup(engine)
    sp = SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=20, ignore_eos=True, reasoning_max_tokens=4,
                        allowed_token_ids=ASCII + [parser.end_id], logit_bias={parser.end_id: -100.0})
    first = run(engine, {"n": (prompt, sp)})
    again = run(engine, {"m": (prompt, sp)})  # the prompt's blocks now come from the prefix cache
    assert again[("m", 0)]["last"].num_reused_blocks > 0
    seqs = []
    for i in range(3):
        check_budgeted(engine, first[("n", i)], 4)
        assert again[("m", i)]["ids"] == first[("n", i)]["ids"]
        assert again[("m", i)]["reasoning"] == first[("n", i)]["reasoning"]
        seqs.append(first[("n", i)]["ids"])
        # sequence i samples as a single request with seed 7 + i
        alone = run(engine, {"s": (prompt, SamplingParams(**{**sp.__dict__, "n": 1, "seed": 7 + i}))})[("s", 0)]
        assert alone["ids"] == first[("n", i)]["ids"]
    assert len({tuple(s) for s in seqs}) > 1


def test_speculative_decoding_keeps_the_budget(tmp_path):
    d = str(make_thinking_checkpoint("qwen3", tmp_path / "q"))
    plain, spec = make_engine(d, max_model_len=256), make_engine(d, max_model_len=256, speculative_method="ngram")
    tok, parser, prompt = _setup(plain)
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, reasoning_max_tokens=6,
                        logit_bias={parser.end_id: -100.0}, allowed_token_ids=[97, 98, 10, parser.end_id])
    a = run(plain, {"a": (prompt, sp)})[("a", 0)]
    b = run(spec, {"b": (prompt, sp)})[("b", 0)]
    assert spec.spec_num_drafts > 0
    assert a["ids"] == b["ids"] and (a["reasoning"], a["content"]) == (b["reasoning"], b["content"])
    check_budgeted(plain, a, 6)


def test_per_request_parser_none_and_the_refusals(engines, tiny_model_dir):
    engine = engines["qwen3"]
    tok, parser, prompt = _setup(engine)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, reasoning_parser="none",
                        logit_bias={parser.end_id: -100.0})
    r = run(engine, {"a": (prompt, sp)})[("a", 0)]
    assert r["splits"] == 0 and r["last"].num_reasoning_tokens == 0  # no thinking span for this request
    with pytest.raises(InvalidRequestError, match="reasoning_max_tokens: must be >= 0"):
        engine.check_request(prompt, SamplingParams(reasoning_max_tokens=-1))
    with pytest.raises(InvalidRequestError, match="reasoning_max_tokens: the model has no thinking span"):
        engine.check_request(prompt, SamplingParams(reasoning_max_tokens=3, reasoning_parser="none"))
    llama = make_engine(tiny_model_dir)  # SmolLM2's tokenizer: no thinking tokens, the parser is off
    assert llama.reasoning.default is None
    with pytest.raises(InvalidRequestError, match="reasoning_max_tokens: the model has no thinking span"):
        llama.check_request([5, 6, 7], SamplingParams(reasoning_max_tokens=3))
    with pytest.raises(InvalidRequestError, match="reasoning_parser: qwen3 cannot be used"):
        llama.check_request([5, 6, 7], SamplingParams(reasoning_parser="qwen3"))
