"""The OpenAI API frontend through the official `openai` SDK (docs/openai/index.md): chat and completions,
streamed and not, n = 2, stop, seed reproducibility, logprobs, response_format, usage in streams,
errors as the SDK's exception classes with their status, health, readiness and metrics.

Against the session's server + frontend (conftest `openai_server`); every request is small
(at most 48 tokens, greedy unless a seed is under test), so the module takes about a minute on a
shared 2-core CPU, most of it the server start shared with the other e2e modules.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

USER = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The capital of France is"


def test_models_lists_the_served_names(openai_client, openai_server):
    ids = [m.id for m in openai_client.models.list().data]
    assert ids == [openai_server.model, "llm"]
    assert openai_client.models.retrieve("llm").id == "llm"
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("no-such-model")


def test_chat_streamed_equals_non_streamed_with_usage(openai_client, openai_server):
    r = openai_client.chat.completions.create(model=openai_server.model, messages=USER, max_tokens=12,
                                              temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.created > 1.7e9
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content and c.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == 12 if c.finish_reason == "length" else r.usage.completion_tokens <= 12
    assert r.usage.prompt_tokens > 10  # the chat template's system + user turns
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    chunks = list(openai_client.chat.completions.create(
        model=openai_server.model, messages=USER, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({ch.id for ch in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [c.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == r.usage
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_streamed_and_echo(openai_client, openai_server):
    r = openai_client.completions.create(model="llm", prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == "llm"
    assert "Paris" in r.choices[0].text
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == 5
    chunks = list(openai_client.completions.create(model="llm", prompt=PROMPT, max_tokens=8, temperature=0,
                                                   stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    echo = openai_client.completions.create(model="llm", prompt=PROMPT, max_tokens=8, temperature=0, echo=True)
    assert echo.choices[0].text == PROMPT + r.choices[0].text
    echo_chunks = list(openai_client.completions.create(model="llm", prompt=PROMPT, max_tokens=8, temperature=0,
                                                        echo=True, stream=True))
    assert "".join(ch.choices[0].text for ch in echo_chunks) == PROMPT + r.choices[0].text


def test_n2_with_seed_is_seed_plus_i(openai_client, openai_server):
    """n = 2 sends two llm requests, seeds seed and seed + 1: each choice is the n = 1 answer of its seed."""
    kw = dict(model=openai_server.model, messages=USER, max_tokens=12, temperature=1.0)
    r = openai_client.chat.completions.create(n=2, seed=1234, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    singles = [openai_client.chat.completions.create(seed=s, **kw) for s in (1234, 1235)]
    one = [x.choices[0].message.content for x in singles]
    assert [c.message.content for c in r.choices] == one
    assert r.usage.completion_tokens == sum(x.usage.completion_tokens for x in singles)
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens  # the prompt counts once
    chunks = list(openai_client.chat.completions.create(n=2, seed=1234, stream=True, **kw))
    for i in (0, 1):
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices[0].index == i) == one[i]


def test_seed_reproducible(openai_client):
    kw = dict(model="llm", prompt="Once upon a time", max_tokens=16, temperature=1.0, top_p=0.95)
    a = openai_client.completions.create(seed=7, **kw).choices[0].text
    b = openai_client.completions.create(seed=7, **kw).choices[0].text
    s = "".join(ch.choices[0].text for ch in openai_client.completions.create(seed=7, stream=True, **kw))
    assert a == b == s


def test_stop_string(openai_client):
    kw = dict(model="llm", prompt="1, 2, 3, 4, 5,", max_tokens=16, temperature=0)
    full = openai_client.completions.create(**kw).choices[0].text
    assert " 8" in full, full
    r = openai_client.completions.create(stop=[" 8"], **kw)
    assert r.choices[0].text == full[:full.index(" 8")] and r.choices[0].finish_reason == "stop"


def test_chat_logprobs(openai_client, openai_server):
    r = openai_client.chat.completions.create(model=openai_server.model, messages=USER, max_tokens=8, temperature=0,
                                              logprobs=True, top_logprobs=3)
    c = r.choices[0]
    items = c.logprobs.content
    assert len(items) == r.usage.completion_tokens
    assert "".join(t.token for t in items) == c.message.content
    for t in items:
        assert len(t.top_logprobs) == 3
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True) and t.logprob == pytest.approx(lps[0])  # greedy: the best
        assert t.bytes == list(t.token.encode()) and t.logprob <= 0


def test_completion_logprobs(openai_client):
    r = openai_client.completions.create(model="llm", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 6
    assert all(len(d) <= 2 and max(d.values()) == pytest.approx(v) for d, v in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]


def test_response_format_json_schema_and_object(openai_client, openai_server):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = openai_client.chat.completions.create(
        model=openai_server.model, max_tokens=48, temperature=0,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age"} and isinstance(obj["name"], str) and isinstance(obj["age"], int)
    assert r.choices[0].finish_reason == "stop"
    r = openai_client.chat.completions.create(model=openai_server.model, max_tokens=48, temperature=0,
                                              messages=[{"role": "user", "content": 'Answer in JSON with one key "answer": what is 2 + 2?'}],
                                              response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_extensions_ignore_eos_min_tokens_logit_bias(openai_client):
    r = openai_client.completions.create(model="llm", prompt=PROMPT, max_tokens=10, temperature=0,
                                         extra_body={"ignore_eos": True, "min_tokens": 10, "top_k": 5,
                                                     "repetition_penalty": 1.1})
    assert r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length"
    # token 29 is "-" in SmolLM2's vocabulary: a +100 bias makes it every token
    r = openai_client.completions.create(model="llm", prompt=PROMPT, max_tokens=4, temperature=0,
                                         logit_bias={"29": 100}, user="someone")
    assert r.choices[0].text == "-" * 4


def _err(fn):
    with pytest.raises(openai.APIStatusError) as ei:
        fn()
    return ei.value


def test_errors_are_sdk_exceptions_with_status_and_param(openai_client, openai_server):
    m = openai_server.model
    chat = openai_client.chat.completions.create
    e = _err(lambda: chat(model=m, messages=USER, temperature=-1))
    assert isinstance(e, openai.BadRequestError) and e.status_code == 400 and e.param == "temperature"
    e = _err(lambda: chat(model=m, messages=USER, max_completion_tokens=10 ** 6))
    assert isinstance(e, openai.BadRequestError) and e.param == "max_completion_tokens", e.message
    e = _err(lambda: chat(model=m, messages=USER, max_tokens=0, stream=True))  # streamed: refused before 200
    assert isinstance(e, openai.BadRequestError) and e.param == "max_tokens"
    e = _err(lambda: chat(model=m, messages=USER, top_logprobs=2))
    assert isinstance(e, openai.BadRequestError) and e.param == "top_logprobs"
    e = _err(lambda: chat(model=m, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]))
    assert isinstance(e, openai.BadRequestError) and e.param.startswith("messages")
    e = _err(lambda: chat(model=m, messages=USER, extra_body={"no_such_option": 1}))
    assert isinstance(e, openai.BadRequestError) and e.param == "no_such_option"
    e = _err(lambda: chat(model=m, messages=USER, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "dependentSchemas": {"a": {}}}}}))
    assert isinstance(e, openai.BadRequestError) and e.param == "response_format", e.message
    e = _err(lambda: chat(model="no-such-model", messages=USER))
    assert isinstance(e, openai.NotFoundError) and e.status_code == 404 and e.code == "model_not_found"
    e = _err(lambda: openai_client.completions.create(model=m, prompt=[1, 2, 3]))
    assert isinstance(e, openai.BadRequestError) and e.param == "prompt"
    e = _err(lambda: openai_client.completions.create(model=m, prompt=PROMPT, suffix="x"))
    assert isinstance(e, openai.BadRequestError) and e.param == "suffix"
    e = _err(lambda: openai_client.completions.create(model=m, prompt=PROMPT, n=0))
    assert isinstance(e, openai.BadRequestError) and e.param == "n"


def test_health_ready_and_metrics(openai_client, openai_server):
    assert httpx.get(f"{openai_server.base}/health").status_code == 200
    assert httpx.get(f"{openai_server.base}/health/ready").status_code == 200
    openai_client.models.list()
    text = httpx.get(f"{openai_server.base}/metrics").text
    assert 'openai_requests_total{endpoint="/v1/models",status="200"}' in text
    assert "openai_request_duration_seconds_bucket" in text and "openai_requests_in_flight" in text
    assert "llm_kv_cache_used_blocks" in text and "nv_inference_request_success" in text  # Triton's, re-exported
