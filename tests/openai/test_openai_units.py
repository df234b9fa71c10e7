"""The frontend's pure parts, without a server (well under a second): Triton / llm error messages ->
HTTP status and OpenAI parameter, OpenAI parameters -> `sampling_parameters`, logprob shapes, and the
n-sequence merge cancelling every sequence when one fails."""

from __future__ import annotations

import asyncio

import pytest

from paddle_llm_openai import logprobs, params
from paddle_llm_openai.errors import OpenAIError, classify
from paddle_llm_openai.protocol import ChatCompletionRequest, CompletionRequest
from paddle_llm_openai.streaming import merged
from paddle_llm_openai.triton_client import Piece


@pytest.mark.parametrize("message, status, param", [
    ("sampling_parameters.temperature: must be >= 0, got -1.0", 400, "temperature"),
    ("sampling_parameters.max_tokens: prompt (31 tokens) + max_tokens (9000) exceeds max_model_len 8192", 400,
     "max_completion_tokens"),
    ("sampling_parameters.logprobs: must be in [0, 20]", 400, "top_logprobs"),
    ("sampling_parameters.structured_outputs.json: unsupported keyword dependentSchemas", 400, "response_format"),
    ("text_input: the prompt has 9000 tokens, more than max_model_len 8192", 400, "messages"),
    ("server busy: 128 requests waiting (max_num_waiting 128); retry later", 503, None),
    ("deadline exceeded: the request ran 2.0 s (timeout 2.0 s); 57 tokens generated", 503, None),
    ("llm instance llm_0_0 is shutting down and takes no new requests; retry on another replica", 503, None),
    ("StatusCode.UNAVAILABLE: failed to connect to all addresses", 503, None),
    ("Request for unknown model: 'llm' is not found", 503, None),
    ("llm instance llm_0_0 is not serving: the engine failed earlier", 503, None),
    ("engine failure: RuntimeError: boom", 500, None),
    ("ValueError: something unexpected", 500, None),
])
def test_classify(message, status, param):
    names = {"text_input": "messages", "sampling_parameters.max_tokens": "max_completion_tokens",
             "sampling_parameters.logprobs": "top_logprobs", "sampling_parameters.structured_outputs": "response_format"}
    e = classify(message, names)
    assert (e.status, e.param) == (status, param)
    body = e.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    if status == 400:
        assert body["message"].startswith(f"{param}: ") and body["type"] == "invalid_request_error"


def test_sampling_chat_and_completions():
    req = ChatCompletionRequest(model="m", messages=[], max_tokens=5, max_completion_tokens=7, temperature=0,
                                stop="x", logprobs=True, top_logprobs=2, logit_bias={"3": -100}, top_k=4,
                                ignore_eos=True, response_format={"type": "json_object"})
    sp, names = params.sampling(req, chat=True, guide=params.response_format_guide(req.response_format))
    assert sp == {"max_tokens": 7, "temperature": 0, "top_k": 4, "ignore_eos": True, "stop": "x",
                  "logit_bias": {"3": -100}, "logprobs": 2, "structured_outputs": {"json_object": True}}
    assert names["sampling_parameters.max_tokens"] == "max_completion_tokens"
    creq = CompletionRequest(model="m", prompt="p", logprobs=3, echo=False, min_p=0.1, priority=-2)
    sp, names = params.sampling(creq, chat=False)
    assert sp == {"min_p": 0.1, "logprobs": 3, "priority": -2} and names["text_input"] == "prompt"
    with pytest.raises(OpenAIError) as ei:
        params.sampling(CompletionRequest(model="m", prompt="p", logprobs=1, echo=True), chat=False)
    assert ei.value.param == "logprobs"


def test_seeds_refused_and_response_format():
    assert params.seeds(None, 2) == [None, None] and params.seeds(5, 3) == [5, 6, 7]
    with pytest.raises(OpenAIError):
        params.seeds(2 ** 64 - 1, 2)
    assert params.response_format_guide({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object"}}}) == {"json": {"type": "object"}}
    assert params.response_format_guide({"type": "text"}) is None
    params.check_refused(CompletionRequest(model="m", prompt="p", best_of=2, n=2))  # best_of == n: fine
    with pytest.raises(OpenAIError) as ei:
        params.check_refused(CompletionRequest(model="m", prompt="p", best_of=3, n=1))
    assert ei.value.param == "best_of"
    with pytest.raises(OpenAIError) as ei:
        params.check_refused(ChatCompletionRequest(model="m", messages=[], modalities=["text", "audio"]))
    assert ei.value.param == "modalities"


def test_logprob_shapes():
    entries = [{"5": {"logprob": -0.5, "rank": 2, "decoded_token": "a"}, "7": {"logprob": -0.1, "rank": 1,
                                                                             "decoded_token": "b"}},
               {"9": {"logprob": -0.2, "rank": 1, "decoded_token": "é"}}]
    chat = logprobs.chat_content(entries, 1)
    assert [c["token"] for c in chat] == ["a", "é"] and chat[0]["top_logprobs"][0]["token"] == "b"
    assert chat[1]["bytes"] == [0xC3, 0xA9]
    comp = logprobs.completion(entries, 2, offset=3)
    assert comp["tokens"] == ["a", "é"] and comp["text_offset"] == [3, 4]
    assert comp["top_logprobs"][0] == {"b": -0.1, "a": -0.5}


def test_merged_cancels_every_sequence_when_one_fails():
    closed = []

    async def ok(i):
        try:
            yield Piece("x", None, 1, 1, None)
            await asyncio.sleep(10)
        finally:
            closed.append(i)

    async def bad():
        yield Piece("y", None, 1, 1, None)
        raise RuntimeError("triton failed")

    async def run():
        got = []
        with pytest.raises(RuntimeError):
            async for i, p in merged([ok(0), bad(), ok(2)]):
                got.append((i, p.text))
        return got

    got = asyncio.run(asyncio.wait_for(run(), 5))
    assert (1, "y") in got and (0, "x") in got  # the error came after its piece; sequence 0 was ended
    assert 0 in closed
