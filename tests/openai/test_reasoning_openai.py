"""Thinking models through the official `openai` SDK: tritonserver on the tiny random Qwen3 thinking
checkpoint (tests/support/thinking_checkpoints.py) and the OpenAI frontend in front of it, both
started by this module.

Checked: message.reasoning and message.reasoning_content (both names) hold the thinking, content the
answer, streamed (delta.reasoning / delta.reasoning_content) and not, equal to the split of `llm`'s
raw text by an independent reference; usage.completion_tokens_details.reasoning_tokens; the budget
(reasoning_max_tokens, thinking_token_budget; different values are a 400 naming the parameter);
reasoning_effort ("none" turns thinking off through the template's enable_thinking, a budget effort
ends the thinking, an unknown value is a 400); chat_template_kwargs.enable_thinking; a forced tool
call parsed from the answer after the thinking; n = 2."""

from __future__ import annotations

import json

import pytest

import paddle_llm_launcher as launcher
from paddle_llm_launcher.frontend import OpenAIFrontend, frontend_command

from clients import llm_stream
from reasoning_reference import reference_split
from thinking_checkpoints import make_thinking_checkpoint

pytestmark = pytest.mark.e2e
THINK_END = 260  # "</think>" in the tiny Qwen3 tokenizer
# only the budget ends the thinking; letters pushed up so that the random model writes visible text
BIAS = {str(THINK_END): -100, **{str(i): 50 for i in range(ord("a"), ord("z") + 1)}}
MESSAGES = [{"role": "user", "content": "What is 2+2? Think first."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reasoning_openai")
    model_dir = make_thinking_checkpoint("qwen3", tmp / "qwen3-tiny-thinking")
    from repo_edit import copy_repository, set_config_parameter

    def edit(repo):
        set_config_parameter(repo / "llm" / "config.pbtxt", "num_kv_blocks", "256")
        set_config_parameter(repo / "llm" / "config.pbtxt", "block_size", "16")

    repo = copy_repository(tmp / "repo", ["llm"], edit)
    http, grpc, metrics = launcher.free_ports(3)
    server = launcher.start_server(repo, http, grpc, metrics, model_dir=str(model_dir), log_path=tmp / "triton.log")
    frontend = None
    try:
        server.wait_ready(timeout=180)
        port = launcher.free_port()
        frontend = OpenAIFrontend(frontend_command(grpc, metrics, port, model_dir, drain_grace=2.0), port,
                                  tmp / "openai.log")
        frontend.wait_ready(60)
        yield {"base_url": frontend.url, "grpc": f"127.0.0.1:{grpc}", "model": model_dir.name,
               "model_dir": str(model_dir)}
    except (RuntimeError, TimeoutError) as e:
        pytest.fail(f"start failed: {e}\n{server.log_tail(40)}\n{frontend.log_tail(40) if frontend else ''}",
                    pytrace=False)
    finally:
        if frontend is not None:
            frontend.stop(10)
        server.stop()


@pytest.fixture(scope="module")
def client(stack):
    import openai

    c = openai.OpenAI(base_url=stack["base_url"], api_key="unused", max_retries=0, timeout=120)
    yield c
    c.close()


def _raw(stack, **sp) -> str:
    """`llm`'s raw text for the rendered chat prompt (the reference the split is checked against)."""
    from paddle_llm_engine.tokenizer import load_tokenizer

    prompt = load_tokenizer(stack["model_dir"]).apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                                    tokenize=False)
    return llm_stream(stack["grpc"], prompt, stream=False, exclude_input_in_output=True,
                      sampling_parameters=json.dumps(sp)).raise_for_error().text


def test_reasoning_fields_and_usage_not_streamed(client, stack):
    r = client.chat.completions.create(model=stack["model"], messages=MESSAGES, max_tokens=20, temperature=0,
                                       logit_bias=BIAS, extra_body={"reasoning_max_tokens": 5})
    msg = r.choices[0].message
    want = reference_split(_raw(stack, max_tokens=20, temperature=0, logit_bias=BIAS, reasoning_max_tokens=5), True)
    assert (msg.reasoning, msg.content) == want and msg.reasoning_content == msg.reasoning
    assert msg.reasoning.endswith("\n") and "</think>" not in msg.content
    assert r.usage.completion_tokens == 20 and r.usage.completion_tokens_details.reasoning_tokens == 7


def test_reasoning_streamed_deltas_join_to_the_non_streamed_answer(client, stack):
    kw = dict(model=stack["model"], messages=MESSAGES, max_tokens=20, temperature=0, logit_bias=BIAS,
              extra_body={"thinking_token_budget": 5})
    whole = client.chat.completions.create(**kw).choices[0].message
    reasoning, reasoning_content, content, usage = "", "", "", None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            d = ch.delta
            reasoning += getattr(d, "reasoning", None) or ""
            reasoning_content += getattr(d, "reasoning_content", None) or ""
            content += d.content or ""
    assert (reasoning, content) == (whole.reasoning, whole.content) and reasoning_content == reasoning
    assert usage.completion_tokens_details.reasoning_tokens == 7


def test_budget_names_conflict_is_a_400_naming_the_parameter(client, stack):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=stack["model"], messages=MESSAGES, max_tokens=4,
                                       extra_body={"reasoning_max_tokens": 3, "thinking_token_budget": 4})
    assert e.value.status_code == 400 and e.value.body["param"] == "reasoning_max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=stack["model"], messages=MESSAGES, max_tokens=4,
                                       reasoning_effort="extreme")
    assert e.value.body["param"] == "reasoning_effort"


def test_reasoning_effort_none_and_enable_thinking_false_turn_thinking_off(client, stack):
    kw = dict(model=stack["model"], messages=MESSAGES, max_tokens=10, temperature=0, logit_bias=BIAS)
    off = client.chat.completions.create(reasoning_effort="none", **kw)
    switch = client.chat.completions.create(extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)
    for r in (off, switch):
        assert r.choices[0].message.reasoning is None and r.usage.completion_tokens_details.reasoning_tokens == 0
        assert r.choices[0].message.content
    assert off.choices[0].message.content == switch.choices[0].message.content
    # a budget effort on this 10-token answer: "minimal" is 256 tokens, so it is all thinking
    minimal = client.chat.completions.create(reasoning_effort="minimal", **kw).choices[0].message
    assert minimal.reasoning and not minimal.content


def test_forced_tool_call_comes_from_the_answer_after_the_thinking(client, stack):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                             "b": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a", "b"], "additionalProperties": False}}}]
    for stream in (False, True):
        kw = dict(model=stack["model"], messages=MESSAGES, max_tokens=150, temperature=0, logit_bias=BIAS,
                  tools=tools, tool_choice="required", extra_body={"reasoning_max_tokens": 4})
        if not stream:
            r = client.chat.completions.create(**kw).choices[0]
            calls, reasoning, finish = r.message.tool_calls, r.message.reasoning, r.finish_reason
            assert calls, r.message
            args = calls[0].function.arguments
            name = calls[0].function.name
        else:
            reasoning, name, args, finish = "", None, "", None
            for chunk in client.chat.completions.create(stream=True, **kw):
                for ch in chunk.choices:
                    reasoning += getattr(ch.delta, "reasoning", None) or ""
                    for tc in ch.delta.tool_calls or ():
                        name = tc.function.name or name
                        args += tc.function.arguments or ""
                    finish = ch.finish_reason or finish
        assert name == "add" and set(json.loads(args)) == {"a", "b"}
        assert reasoning and finish == "stop"  # a forced call ends with stop, as OpenAI and vLLM end it


def test_n_two_sequences_each_get_their_split(client, stack):
    r = client.chat.completions.create(model=stack["model"], messages=MESSAGES, max_tokens=14, temperature=1.0,
                                       seed=3, n=2, logit_bias=BIAS, extra_body={"reasoning_max_tokens": 4})
    for i, ch in enumerate(r.choices):
        want = reference_split(_raw(stack, max_tokens=14, temperature=1.0, seed=3 + i, logit_bias=BIAS,
                                    reasoning_max_tokens=4), True)
        assert (ch.message.reasoning, ch.message.content) == want
    assert r.usage.completion_tokens_details.reasoning_tokens == 12
