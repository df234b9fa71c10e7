"""Guided decoding against the real server on SmolLM2, greedy, small max_tokens: a JSON schema
whose every output parses and validates, a regex whose every output fully matches, a choice among
three strings; streamed and not; on `llm` (vLLM sampling_parameters keys guided_decoding /
structured_outputs) and on `ensemble` (TensorRT-LLM guided_decoding_guide_type / _guide); each run
next to a concurrent unguided request whose text equals its text alone. Bad guides are INVALID_ARG
naming the field."""

from __future__ import annotations

import json
import re

import pytest
import requests

from clients import ensemble_stream, llm_stream, run_concurrently

pytestmark = pytest.mark.e2e

SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 20},
                         "country": {"type": "string", "maxLength": 20},
                         "population": {"type": "integer", "minimum": 0, "maximum": 100000000}},
          "required": ["city", "country", "population"], "additionalProperties": False}
REGEX = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
CHOICES = ["red", "green", "blue"]
EBNF_CHOICE = 'root ::= "red" | "green" | "blue"'

JSON_Q = "Describe Paris as JSON with keys city, country and population."
DATE_Q = "What is today's date?"
COLOUR_Q = "What colour is the sky? Answer red, green or blue."
FREE_Q = "Name three animals that live in the sea."
MAX_TOKENS = 48


def validate(value, schema) -> None:
    """The JSON-schema keywords SCHEMA uses (type, properties, required, additionalProperties,
    maxLength, minimum, maximum); raises AssertionError."""
    t = schema.get("type")
    if t == "object":
        assert isinstance(value, dict), value
        for k in schema.get("required", []):
            assert k in value, (k, value)
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(schema["properties"]), value
        for k, v in value.items():
            validate(v, schema["properties"].get(k, {}))
    elif t == "string":
        assert isinstance(value, str) and len(value) <= schema.get("maxLength", len(value)), value
    elif t == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), value


def check(kind: str, text: str) -> None:
    if kind == "json":
        validate(json.loads(text), SCHEMA)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    else:
        assert text in CHOICES, text


# -- llm: vLLM keys ---------------------------------------------------------------------------------

LLM_GUIDES = {  # kind -> (question, sampling_parameters key, guide object)
    "json": (JSON_Q, "structured_outputs", {"json": SCHEMA}),
    "regex": (DATE_Q, "guided_decoding", {"regex": REGEX}),
    "choice": (COLOUR_Q, "guided_decoding", {"choice": CHOICES}),
}


def llm_call(url, chat_prompt, question, stream, guide_key=None, guide=None, as_string=False):
    sp = {"temperature": 0, "max_tokens": MAX_TOKENS}
    if guide_key:
        sp[guide_key] = json.dumps(guide) if as_string else guide  # the vLLM backend reads both forms
    r = llm_stream(url, chat_prompt(question), stream=stream, sampling_parameters=json.dumps(sp),
                   exclude_input_in_output=None if stream else True, return_finish_reason=True)
    return r.raise_for_error()


@pytest.fixture(scope="module")
def free_llm_text(triton_server, chat_prompt):
    return llm_call(triton_server.grpc_url, chat_prompt, FREE_Q, stream=True).text


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "single"])
def test_llm_guides_hold_next_to_an_unguided_request(triton_server, chat_prompt, free_llm_text, stream):
    url = triton_server.grpc_url
    kinds = list(LLM_GUIDES)
    calls = [lambda k=k: llm_call(url, chat_prompt, LLM_GUIDES[k][0], stream, LLM_GUIDES[k][1], LLM_GUIDES[k][2],
                                  as_string=not stream) for k in kinds]
    calls.append(lambda: llm_call(url, chat_prompt, FREE_Q, stream))
    *guided, free = run_concurrently(calls)
    assert free.text == free_llm_text
    for kind, r in zip(kinds, guided):
        check(kind, r.text)
        assert r.last("finish_reason").reshape(-1)[0] in (b"stop", "stop"), (kind, r.text)
        if stream:
            assert len(r.responses) >= 1


@pytest.mark.parametrize("guide, field", [
    ({"guided_decoding": {"json": {"type": "nonsense"}}}, "sampling_parameters.guided_decoding.json"),
    ({"structured_outputs": {"regex": "(["}}, "sampling_parameters.structured_outputs.regex"),
    ({"guided_decoding": {"grammar": "root ::= (("}}, "sampling_parameters.guided_decoding.grammar"),
    ({"guided_decoding": {"choice": []}}, "sampling_parameters.guided_decoding.choice"),
])
def test_llm_bad_guide_is_invalid_arg(triton_server, guide, field):
    r = llm_stream(triton_server.grpc_url, "Hello", stream=True,
                   sampling_parameters=json.dumps({"max_tokens": 4, **guide}))
    assert r.error is not None and str(r.error).startswith(field + ":"), r.error
    assert not r.responses
    h = requests.post(f"{triton_server.http_base}/v2/models/llm/generate", timeout=60,
                      json={"text_input": "Hello", "sampling_parameters": json.dumps({"max_tokens": 4, **guide})})
    assert h.status_code == 400 and field in h.json()["error"], h.text  # 400 = INVALID_ARG


def test_llm_http_generate_with_a_guide(triton_server, chat_prompt):
    sp = {"temperature": 0, "max_tokens": MAX_TOKENS, "guided_decoding": {"regex": REGEX}}
    r = requests.post(f"{triton_server.http_base}/v2/models/llm/generate", timeout=120,
                      json={"text_input": chat_prompt(DATE_Q), "stream": False, "exclude_input_in_output": True,
                            "sampling_parameters": json.dumps(sp)})
    assert r.status_code == 200, r.text
    check("regex", r.json()["text_output"])


# -- ensemble: TensorRT-LLM inputs -----------------------------------------------------------------

ENSEMBLE_GUIDES = {  # kind -> (question, guide type, guide)
    "json": (JSON_Q, "json_schema", json.dumps(SCHEMA)),
    "regex": (DATE_Q, "regex", REGEX),
    "choice": (COLOUR_Q, "ebnf_grammar", EBNF_CHOICE),
}


def ens_call(url, question, stream, guide_type=None, guide=None):
    return ensemble_stream(url, question, stream=stream, apply_chat_template=True, temperature=0.0,
                           max_tokens=MAX_TOKENS, exclude_input_in_output=True,
                           guided_decoding_guide_type=guide_type, guided_decoding_guide=guide).raise_for_error()


@pytest.fixture(scope="module")
def free_ensemble_text(triton_server):
    return ens_call(triton_server.grpc_url, FREE_Q, stream=True).text


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "single"])
def test_ensemble_guides_hold_next_to_an_unguided_request(triton_server, free_ensemble_text, stream):
    url = triton_server.grpc_url
    kinds = list(ENSEMBLE_GUIDES)
    calls = [lambda k=k: ens_call(url, ENSEMBLE_GUIDES[k][0], stream, *ENSEMBLE_GUIDES[k][1:]) for k in kinds]
    calls.append(lambda: ens_call(url, FREE_Q, stream))
    *guided, free = run_concurrently(calls)
    assert free.text == free_ensemble_text
    for kind, r in zip(kinds, guided):
        check(kind, r.text)
        if not stream:
            assert len(r.responses) == 1


def test_ensemble_json_guide_type_gives_json(triton_server):
    """guided_decoding_guide_type "json" alone (TensorRT-LLM's built-in JSON grammar, no guide): the
    output is a JSON object or array (SmolLM2 may not finish it within max_tokens: a valid start)."""
    r = ens_call(triton_server.grpc_url, "Reply with the JSON array [1, 2, 3] and nothing else.", False, "json")
    assert r.text[:1] in ("{", "["), r.text


@pytest.mark.parametrize("guide_type, guide, field", [
    ("xml", "x", "guided_decoding_guide_type"),
    ("regex", None, "guided_decoding_guide"),
    ("json_schema", "{not json", "guided_decoding_guide"),
    ("regex", "a{2", "guided_decoding_guide"),
    ("ebnf_grammar", "root ::= undefined_rule", "guided_decoding_guide"),
])
def test_ensemble_bad_guide_is_invalid_arg(triton_server, guide_type, guide, field):
    r = ensemble_stream(triton_server.grpc_url, "Hello", max_tokens=4, guided_decoding_guide_type=guide_type,
                        guided_decoding_guide=guide)
    assert r.error is not None and f"{field}:" in str(r.error), r.error
    assert not r.responses
    body = {"text_input": "Hello", "max_tokens": 4, "guided_decoding_guide_type": guide_type}
    if guide is not None:
        body["guided_decoding_guide"] = guide
    h = requests.post(f"{triton_server.http_base}/v2/models/ensemble/generate", json=body, timeout=60)
    assert h.status_code == 400 and field in h.json()["error"], h.text  # 400 = INVALID_ARG
