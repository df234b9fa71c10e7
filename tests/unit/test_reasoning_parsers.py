"""Reasoning parsers without a model: the incremental text split at every point a stream can be cut
(a delta ending inside `</think>`, inside an opening `<think>`, inside ERNIE's `<response>`), non-ASCII
text, the thinking state's budget and counts, and which parser each family / setting gets on the
tiny thinking tokenizers (tests/support/thinking_checkpoints.py) and on a model that cannot think.

The reference split (`reference_split`, tests/support/reasoning_reference.py) is written independently
of the parser: regular expressions over the whole text, with the rules of reasoning/text_parser.py's
docstring."""

from __future__ import annotations

import logging

import pytest

from reasoning_reference import reference_split
from thinking_checkpoints import make_thinking_checkpoint

from paddle_llm_engine import InvalidRequestError
from paddle_llm_engine.reasoning import (PARSERS, EngineReasoning, ReasoningTextParser, ThinkingState,
                                         auto_family, split_text)

ERNIE_TAGS = ("<response>", "</response>")


def feed_split(text: str, cuts: list[int], thinking: bool, drop_tags=()) -> tuple[str, str, list]:
    """Feed text cut at `cuts`; (reasoning, content, the per-delta parts)."""
    p = ReasoningTextParser("<think>", "</think>", thinking, drop_tags)
    parts, prev = [], 0
    for c in cuts + [len(text)]:
        parts.append(p.feed(text[prev:c]))
        prev = c
    parts.append(p.finish())
    return "".join(r for r, _ in parts), "".join(c for _, c in parts), parts


TEXTS = [
    ("<think>\nplan: 2+2\n</think>\n\nThe answer is 4.", True, ()),
    ("\nplan without an opener\n</think>\n\nAnswer", True, ()),  # Qwen3-2507 / DeepSeek-R1: opened by the prompt
    ("  <think>deux idées, 思考 😀 é\n</think>\n\n答案：四 😀", True, ()),  # non-ASCII on both sides
    ("truncated thinking </thi", True, ()),  # ends inside the marker: all reasoning
    ("x <think> later is text </think>ok", True, ()),  # a later <think> is reasoning text
    ("ans </think> <think> stays", False, ()),  # the prompt closed the span: all content
    ("reason\n</think>\n\n<response>\nfinal 答\n</response>\n", True, ERNIE_TAGS),
    ("<response>only answer</response>", False, ERNIE_TAGS),
    ("</think>", True, ()),
    ("", True, ()),
    ("<thin", True, ()),  # an unfinished opener: reasoning text at the end
]


@pytest.mark.parametrize("text,thinking,tags", TEXTS)
def test_every_single_cut_matches_the_reference(text, thinking, tags):
    want = reference_split(text, thinking, tags)
    assert split_text(text, "<think>", "</think>", thinking, tags) == want
    for c in range(len(text) + 1):
        r, content, _ = feed_split(text, [c], thinking, tags)
        assert (r, content) == want, f"cut at {c}: {text[:c]!r} | {text[c:]!r}"


@pytest.mark.parametrize("text,thinking,tags", TEXTS)
def test_one_character_per_delta_and_every_pair_of_cuts(text, thinking, tags):
    want = reference_split(text, thinking, tags)
    r, c, _ = feed_split(text, list(range(1, len(text))), thinking, tags)
    assert (r, c) == want
    for a in range(len(text)):
        for b in range(a, len(text)):
            assert feed_split(text, [a, b], thinking, tags)[:2] == want, (a, b)


def test_a_delta_ending_inside_the_end_marker_is_held_back():
    p = ReasoningTextParser("<think>", "</think>", True)
    assert p.feed("let me see</th") == ("let me see", "")  # "</th" may be the marker: held
    assert p.feed("ink>\n\nIt") == ("", "It")
    assert p.feed(" is 4") == ("", " is 4")
    assert not p.thinking
    p = ReasoningTextParser("<think>", "</think>", True)
    assert p.feed("a </") == ("a ", "")
    assert p.feed("b") == ("</b", "")  # not the marker after all: released as reasoning
    p = ReasoningTextParser("<think>", "</think>", True)
    assert p.feed("<thi") == ("", "")  # may be the opener
    assert p.feed("nk>x") == ("x", "")


def test_thinking_state_budget_forces_the_end_sequence_after_exactly_n_tokens():
    END, SEQ = 9, (5, 9, 6, 6)
    st = ThinkingState(END, SEQ, thinking=True, budget=3)
    emitted = []
    for chosen in (100, 101, 102, 103, 104, 105, 106, 107):
        forced = st.forced_token()
        tok = chosen if forced is None else forced
        assert st.active or forced is None
        st.observe(tok)
        emitted.append(tok)
    assert emitted == [100, 101, 102, 5, 9, 6, 6, 107]
    assert (st.num_thinking, st.num_reasoning, st.thinking, st.active) == (3, 5, False, False)


def test_thinking_state_natural_end_and_zero_budget_and_no_thinking():
    st = ThinkingState(9, (9,), thinking=True, budget=10)
    for tok in (1, 2, 9, 3):
        assert st.forced_token() is None
        st.observe(tok)
    assert (st.num_thinking, st.num_reasoning, st.thinking) == (3, 3, False)
    st = ThinkingState(9, (5, 9), thinking=True, budget=0)
    assert st.forced_token() == 5
    st.observe(5)
    assert st.forced_token() == 9
    st.observe(9)
    assert st.forced_token() is None and not st.active and st.num_reasoning == 2 and st.num_thinking == 0
    st = ThinkingState(9, (9,), thinking=False, budget=0)  # the prompt closed the span: nothing to force
    assert st.forced_token() is None and not st.active


@pytest.fixture(scope="module")
def thinking_dirs(tmp_path_factory):
    return {f: str(make_thinking_checkpoint(f, tmp_path_factory.mktemp(f))) for f in PARSERS}


def _tok(model_dir):
    from paddle_llm_engine.tokenizer import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.mark.parametrize("family,model_type", [("qwen3", "qwen3"), ("ernie45", "ernie4_5"),
                                               ("deepseek_r1", "qwen2")])
def test_auto_picks_the_family_and_binds_its_tokens(thinking_dirs, family, model_type, caplog):
    tok = _tok(thinking_dirs[family])
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.reasoning.registry"):
        r = EngineReasoning("auto", model_type, tok.chat_template, tok)
    assert r.default is not None and r.default.name == family
    assert [m for m in caplog.messages if "reasoning parser" in m] == [f"reasoning parser: {r.description}"]
    vocab = tok.get_vocab()
    assert (r.default.start_id, r.default.end_id) == (vocab["<think>"], vocab["</think>"])
    assert r.default.end_sequence == tuple(tok.encode("\n</think>\n\n", add_special_tokens=False))
    assert tok.decode(list(r.default.end_sequence), skip_special_tokens=False) == "\n</think>\n\n"
    # ERNIE's markers are special tokens in its tokenizer here: the detokenizer must keep them
    assert bool(r.default.special_marker_ids) == (family == "ernie45")
    assert EngineReasoning("none", model_type, tok.chat_template, tok).default is None
    other = "qwen3" if family != "qwen3" else "deepseek_r1"
    assert r.for_request(other).name == other and r.for_request("none") is None
    assert r.for_request(None) is r.default and r.for_request("ernie-x1").name == "ernie45"
    with pytest.raises(InvalidRequestError, match="reasoning_parser: unknown parser 'gpt_oss'"):
        r.for_request("gpt_oss")


def test_a_model_without_thinking_tokens_is_off_and_says_why_once(smollm2_tokenizer, caplog):
    tok = smollm2_tokenizer
    assert auto_family("llama", tok.chat_template) is None
    with caplog.at_level(logging.INFO, logger="paddle_llm_engine.reasoning.registry"):
        r = EngineReasoning("auto", "llama", tok.chat_template, tok)
    assert r.default is None
    assert [m for m in caplog.messages if "reasoning parser" in m] == [
        "reasoning parser: off (auto: the chat template of this llama mentions no <think> / </think>)"]
    # a template that mentions the markers while the tokenizer lacks them: off, with the reason
    r = EngineReasoning("auto", "qwen3", "{{ '<think>' }}", tok)
    assert r.default is None and "has no <think> token" in r.description
    with pytest.raises(ValueError, match="reasoning_parser qwen3: the tokenizer has no <think> token"):
        EngineReasoning("qwen3", "llama", tok.chat_template, tok)
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        EngineReasoning("o1", "llama", tok.chat_template, tok)
    with pytest.raises(InvalidRequestError, match="reasoning_parser: qwen3 cannot be used with this model"):
        EngineReasoning("auto", "llama", tok.chat_template, tok).for_request("qwen3")


def _prompt(tok, messages, **kw):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
    return [int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


def test_where_the_output_starts_from_the_real_templates(thinking_dirs):
    user = [{"role": "user", "content": "2+2?"}]
    tok = _tok(thinking_dirs["qwen3"])
    p = PARSERS["qwen3"].bind(tok)
    assert p.thinks_at_start(_prompt(tok, user))  # the model opens <think> itself
    assert not p.thinks_at_start(_prompt(tok, user, enable_thinking=False))  # empty closed span
    history = user + [{"role": "assistant", "content": "<think>\nhm\n</think>\n\n4"}, {"role": "user", "content": "3+3?"}]
    assert p.thinks_at_start(_prompt(tok, history))  # an earlier turn's </think> does not close this one
    tool_turn = user + [{"role": "assistant", "content": "", "reasoning_content": "need a tool",
                         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                        {"role": "tool", "content": "4"}]
    assert p.thinks_at_start(_prompt(tok, tool_turn))
    for fam in ("ernie45", "deepseek_r1"):  # the generation prompt opens the span
        tok = _tok(thinking_dirs[fam])
        ids = _prompt(tok, user)
        assert ids[-2:] == [tok.get_vocab()["<think>"], tok.encode("\n", add_special_tokens=False)[0]]
        assert PARSERS[fam].bind(tok).thinks_at_start(ids)
