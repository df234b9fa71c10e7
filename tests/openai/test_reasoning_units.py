"""The chat endpoint's reasoning handling without a server: a stand-in `llm` client yields the pieces
`llm` sends with return_reasoning (thinking apart from the answer), so the thinking can contain text
a random model never writes, here a complete tool call. Checked: tool calls are parsed from the answer
only (never from the thinking), streamed and not; both reasoning field names; the request to `llm`
(return_reasoning, the budget from reasoning_effort, enable_thinking to the template, the
--reasoning-parser setting) and the 400s of the reasoning fields."""

from __future__ import annotations

import asyncio
import json

import pytest

from thinking_checkpoints import make_thinking_checkpoint

from paddle_llm_openai import chat
from paddle_llm_openai.chat_template import ChatRenderer
from paddle_llm_openai.errors import OpenAIError
from paddle_llm_openai.lora import LoraAdapters
from paddle_llm_openai.protocol import ChatCompletionRequest
from paddle_llm_openai.triton_client import Piece

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
# what llm sends for "I could call <tool_call>...</tool_call> but it is 3." split by its parser
PIECES = [("I could call ", ""), (CALL[:20], ""), (CALL[20:], ""), (" but no.\n", ""), ("", "It is"), ("", " 3.")]


class FakeLLM:
    def __init__(self, pieces):
        self.pieces, self.calls = pieces, []

    async def generate(self, prompt, sp, stream, logprobs=False, request_id="", reasoning=False):
        self.calls.append({"prompt": prompt, "sp": dict(sp), "stream": stream, "reasoning": reasoning})
        chunks = self.pieces if stream else [("".join(r for r, _ in self.pieces), "".join(c for _, c in self.pieces))]
        for k, (r, c) in enumerate(chunks):
            last = k == len(chunks) - 1
            yield Piece(text=c, finish_reason="stop" if last else None, num_input_tokens=9,
                        num_output_tokens=1 if stream else len(self.pieces), logprobs=None,
                        reasoning=r if reasoning else None, num_reasoning_tokens=(1 if r else 0) if stream else 4)


class FakeFrontend:
    def __init__(self, model_dir, pieces=PIECES, reasoning_parser="auto"):
        self.served_names = ["m"]
        self.renderer = ChatRenderer(model_dir)
        self.llm = FakeLLM(pieces)
        self.reasoning_parser = reasoning_parser
        self.llm_config = {}  # the llm's config.pbtxt parameters: no LoRA
        self.lora = LoraAdapters(self)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return str(make_thinking_checkpoint("qwen3", tmp_path_factory.mktemp("q")))


def _req(**kw):
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "1+2?"}], **kw)


async def _events(fe, req) -> list[dict]:
    """The SSE events of a streamed chat request, [DONE] left out."""
    gen = await chat.create(fe, req)
    out = []
    async for ev in gen:
        body = ev.decode()[len("data: "):].strip()
        if body != "[DONE]":
            out.append(json.loads(body))
    return out


def test_tool_calls_come_from_the_answer_only(qwen3_dir):
    fe = FakeFrontend(qwen3_dir)
    r = asyncio.run(chat.create(fe, _req(tools=TOOLS)))
    msg = r["choices"][0]["message"]
    assert "tool_calls" not in msg and r["choices"][0]["finish_reason"] == "stop"
    assert msg["content"] == "It is 3."
    assert msg["reasoning"] == msg["reasoning_content"] == "I could call " + CALL + " but no.\n"
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}
    assert fe.llm.calls[0]["reasoning"] is True


def test_streamed_tool_calls_come_from_the_answer_only(qwen3_dir):
    fe = FakeFrontend(qwen3_dir)
    events = asyncio.run(_events(fe, _req(tools=TOOLS, stream=True, stream_options={"include_usage": True})))
    deltas = [c["delta"] for e in events for c in e["choices"]]
    assert not any(d.get("tool_calls") for d in deltas)
    assert "".join(d.get("reasoning") or "" for d in deltas) == "I could call " + CALL + " but no.\n"
    assert [d.get("reasoning_content") for d in deltas] == [d.get("reasoning") for d in deltas]
    assert "".join(d.get("content") or "" for d in deltas) == "It is 3."
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


def test_a_call_in_the_answer_is_parsed_after_the_thinking(qwen3_dir):
    fe = FakeFrontend(qwen3_dir, pieces=[("let me add\n", ""), ("", CALL[:30]), ("", CALL[30:])])
    r = asyncio.run(chat.create(fe, _req(tools=TOOLS)))
    (call,) = r["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    assert r["choices"][0]["message"]["reasoning"] == "let me add\n" and r["choices"][0]["finish_reason"] == "tool_calls"


def test_what_is_sent_to_llm_for_each_reasoning_field(qwen3_dir):
    fe = FakeFrontend(qwen3_dir)
    asyncio.run(chat.create(fe, _req(reasoning_effort="none")))
    call = fe.llm.calls[-1]
    assert call["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # the template's switch
    assert "reasoning_max_tokens" not in call["sp"]
    for effort, n in (("minimal", 256), ("low", 1024), ("medium", 4096)):
        asyncio.run(chat.create(fe, _req(reasoning_effort=effort)))
        assert fe.llm.calls[-1]["sp"]["reasoning_max_tokens"] == n
    asyncio.run(chat.create(fe, _req(reasoning_effort="high")))
    assert "reasoning_max_tokens" not in fe.llm.calls[-1]["sp"]
    asyncio.run(chat.create(fe, _req(reasoning_effort="low", thinking_token_budget=7)))  # the body's budget wins
    assert fe.llm.calls[-1]["sp"]["reasoning_max_tokens"] == 7
    asyncio.run(chat.create(fe, _req(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})))
    assert fe.llm.calls[-1]["prompt"].endswith("<|im_start|>assistant\n")  # the explicit switch wins
    off = FakeFrontend(qwen3_dir, reasoning_parser="none")
    r = asyncio.run(chat.create(off, _req()))
    assert off.llm.calls[-1]["reasoning"] is False and off.llm.calls[-1]["sp"]["reasoning_parser"] == "none"
    assert "reasoning" not in r["choices"][0]["message"] and "completion_tokens_details" not in r["usage"]
    named = FakeFrontend(qwen3_dir, reasoning_parser="deepseek_r1")
    asyncio.run(chat.create(named, _req()))
    assert named.llm.calls[-1]["sp"]["reasoning_parser"] == "deepseek_r1" and named.llm.calls[-1]["reasoning"]


@pytest.mark.parametrize("kw,param", [(dict(reasoning_effort="huge"), "reasoning_effort"),
                                      (dict(reasoning_max_tokens=1, thinking_token_budget=2), "reasoning_max_tokens")])
def test_bad_reasoning_fields_are_400_naming_them(qwen3_dir, kw, param):
    with pytest.raises(OpenAIError) as e:
        asyncio.run(chat.create(FakeFrontend(qwen3_dir), _req(**kw)))
    assert e.value.status == 400 and e.value.param == param


def test_the_cli_checks_reasoning_parser():
    from paddle_llm_openai.cli import main

    assert main(["--reasoning-parser", "o1"]) == 2
