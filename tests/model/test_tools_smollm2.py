"""Tool calls on the default model (SmolLM2-135M-Instruct) through the engine's offline API, with the
prompt and the guide exactly as the OpenAI frontend builds them (chat_template.ChatRenderer, whose
plain ChatML template gets the tools described in the Hermes `<tool_call>` format;
tools.guide_for; the `llm` contract's sampling_parameters): the 10 tool sets of
tests/support/structured_cases.py, each with tool_choice "required", named (the set's first tool) and
"auto", max_tokens 128, in one batch (about 40 s on 2 cores).

Every call the model makes is parsed by the family's parser and its arguments validate with
`jsonschema` against the tool's parameters made strict (no key the schema does not name).
- forced (greedy): exactly calls (named: one call of that tool), ended by the guide ("stop");
- "auto", greedy: SmolLM2 answers in text (measured: 10 of 10), counted and printed;
- "auto" nudged to call: the same requests with `logit_bias` +4 on the tokens "<" and "tool" (a
  client's own parameter), greedy and seed 1 at temperature 1, so that the model starts calls and
  the lazy grammar is exercised: with parallel_tool_calls false every answer is text or one call
  that validates and stops; with parallel calls (at most tool_grammar.MAX_PARALLEL_CALLS) every
  call validates except a last one that max_tokens cut (finish_reason "length"; counted, printed).
"""

from __future__ import annotations

import json

import pytest

from structured_cases import TOOL_SETS, check

from paddle_llm_engine import LLM
from paddle_llm_openai.chat_template import ChatRenderer
from paddle_llm_openai.tools import guide_for
from paddle_llm_triton.contracts.vllm import from_vllm_json

MAX_TOKENS = 128  # room for four calls of these tools; each step of the 70-row batch costs the same
NUDGE = {"44": 4.0, "19324": 4.0}  # SmolLM2 token ids of "<" and "tool" (`<tool_call>` is < tool _ call >)
# (mode, parallel_tool_calls, logit_bias, temperature, seed)
AUTO_RUNS = [("auto", None, None, 0.0, None)] + [
    (f"nudged{'' if parallel is None else '_one'}", parallel, NUDGE, t, seed)
    for parallel in (None, False) for t, seed in ((0.0, None), (1.0, 1))]


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    return LLM(smollm2_dir, device="cpu", max_num_seqs=128, num_threads=2)


def request(tools, choice, parser, parallel=None, bias=None, t=0.0, seed=None):
    """SamplingParams as model `llm` builds them from what the frontend sends."""
    body = {**guide_for(tools, choice, parser, parallel), "temperature": t, "max_tokens": MAX_TOKENS}
    if bias:
        body["logit_bias"] = bias
    if seed is not None:
        body["seed"] = seed
    return from_vllm_json(json.dumps(body))


@pytest.fixture(scope="module")
def runs(llm, smollm2_dir):
    """[(set name, mode, seed, tools, parsed content, parsed calls, Completion)] in one batch."""
    renderer = ChatRenderer(smollm2_dir)
    parser = renderer.tool_parser
    jobs = []
    for name, question, tools in TOOL_SETS:
        prompt = renderer.render([{"role": "user", "content": question}], tools, True, None)
        named = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        jobs.append((name, "required", None, tools, prompt, request(tools, "required", parser)))
        jobs.append((name, "named", None, tools, prompt, request(tools, named, parser)))
        for mode, parallel, bias, t, seed in AUTO_RUNS:
            jobs.append((name, mode, seed, tools, prompt, request(tools, "auto", parser, parallel, bias, t, seed)))
    outs = llm.generate([j[4] for j in jobs], [j[5] for j in jobs])
    return [(n, m, seed, tools) + parser.parse(o.text) + (o,) for (n, m, seed, tools, _, _), o in zip(jobs, outs)]


def check_calls(tools, calls, label) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for c in calls:
        assert c["function"]["name"] in schemas, (label, c)
        check(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])


@pytest.mark.parametrize("mode", ["required", "named"])
def test_forced_calls_parse_validate_and_stop(runs, mode):
    for name, m, _, tools, content, calls, o in runs:
        if m != mode:
            continue
        assert o.finish_reason == "stop", (name, o.text)
        assert content is None and calls, (name, o.text)
        if mode == "named":
            assert [c["function"]["name"] for c in calls] == [tools[0]["function"]["name"]], (name, o.text)
        check_calls(tools, calls, name)


def summary(auto) -> str:
    lines = []
    for name, mode, seed, _, _, calls, o in auto:
        what = ", ".join(c["function"]["name"] + " ".join(c["function"]["arguments"].split()) for c in calls) or repr(o.text[:50])
        lines.append(f"  {mode} {name} seed {seed}: {o.finish_reason}: {what[:160]}")
    return "\n".join(lines)


def test_auto_answers_text_or_valid_calls(runs):
    auto = [r for r in runs if r[1].startswith(("auto", "nudged"))]
    counts = {}
    for name, mode, seed, tools, _, calls, o in auto:
        label = (name, mode, seed, o.text)
        c = counts.setdefault(mode, {"answers": 0, "with calls": 0, "calls": 0, "cut": 0})
        c["answers"] += 1
        if not calls:
            assert "<tool_call>" not in o.text, label
            continue
        c["with calls"] += 1
        c["calls"] += len(calls)
        if o.finish_reason == "length":  # only the last call may be cut, by max_tokens
            assert mode == "nudged", label  # one call at most: it always fits in MAX_TOKENS here
            c["cut"] += 1
            calls = calls[:-1]
        else:
            assert o.finish_reason == "stop", label
        if mode == "nudged_one":
            assert len(calls) == 1, label
        check_calls(tools, calls, label)
    print(f"\ntool_choice auto, max_tokens {MAX_TOKENS}: " + "; ".join(
        f"{m}: {c['with calls']} of {c['answers']} answers called ({c['calls']} calls, {c['cut']} last call cut "
        f"by max_tokens)" for m, c in counts.items()) + "\n" + summary(auto))
    assert counts["nudged"]["with calls"] >= 5 and counts["nudged_one"]["with calls"] >= 5  # the grammar was used
