"""Model `llm` called the way clients of Triton's vLLM backend call it: tritonclient gRPC streaming,
every input shape [1] (max_batch_size 0), sampling_parameters a JSON object whose values are strings
({"temperature": "0", "max_tokens": "16"}, as in the vllm_backend samples), and the return_* flags."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from clients import decode_str, grpc_stream, llm_inputs, llm_stream, run_concurrently, sampling_json
from http_clients import http_generate, http_generate_stream, server_ready

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is"
COUNT_PROMPT = "1, 2, 3, 4,"
STORY = "Once upon a time"
GREEDY16 = {"temperature": "0", "max_tokens": "16"}
ALL_FLAGS = dict(return_finish_reason=True, return_num_input_tokens=True, return_num_output_tokens=True,
                 return_cumulative_logprob=True, return_logprobs=True)


def scalar(r, name):
    return r.last(name).reshape(-1)[0]


def entries_of(r) -> list[dict]:
    out = []
    for arr in r.all("logprobs"):
        out.extend(json.loads(arr.reshape(-1)[0]))
    return out


def assert_error_names(r, name):
    assert r.error is not None, f"expected an error naming {name!r}, got text {r.text!r}"
    assert name in str(r.error), str(r.error)
    assert not r.responses


# -- streaming / non-streaming / exclude_input_in_output -------------------------------------------

def test_stream_deltas_join_to_non_streamed_text(triton_server):
    url = triton_server.grpc_url
    s = llm_stream(url, PROMPT, stream=True, sampling_parameters=GREEDY16).raise_for_error()
    assert len(s.responses) > 1
    assert "Paris" in s.text
    n = llm_stream(url, PROMPT, stream=False, sampling_parameters=GREEDY16,
                   exclude_input_in_output=True).raise_for_error()
    assert len(n.responses) == 1
    assert n.text == s.text


def test_non_streamed_prepends_prompt_unless_excluded(triton_server):
    url = triton_server.grpc_url
    excl = llm_stream(url, PROMPT, stream=False, sampling_parameters=GREEDY16,
                      exclude_input_in_output=True).raise_for_error().text
    for flag in (None, False):
        r = llm_stream(url, PROMPT, stream=False, sampling_parameters=GREEDY16,
                       exclude_input_in_output=flag).raise_for_error()
        assert r.text == PROMPT + excl, (flag, r.text)
    h = http_generate(triton_server.http_base, "llm",
                      {"text_input": PROMPT, "sampling_parameters": sampling_json(GREEDY16)})
    assert h.status == 200, h.body
    assert h.body["text_output"] == PROMPT + excl


# the vLLM backend's own text (its src/utils/request.py raises it, src/model.py prefixes it, and its
# CI's enabled_stream_test.py compares the whole message)
VLLM_STREAM_PROMPT_REFUSAL = "Error generating stream: When streaming, `exclude_input_in_output` = False is not allowed."


def test_streaming_with_exclude_input_false_is_rejected(triton_server):
    """As in the vLLM backend: a stream never repeats the prompt, and asking for it is an error
    with exactly the vLLM backend's message (INVALID_ARG here)."""
    r = llm_stream(triton_server.grpc_url, PROMPT, stream=True, sampling_parameters=GREEDY16,
                   exclude_input_in_output=False)
    assert_error_names(r, "exclude_input_in_output")
    assert r.error.message() == VLLM_STREAM_PROMPT_REFUSAL
    h = http_generate_stream(triton_server.http_base, "llm", {"text_input": PROMPT, "stream": True,
                                                             "exclude_input_in_output": False,
                                                             "sampling_parameters": sampling_json(GREEDY16)})
    assert h.status == 400 and VLLM_STREAM_PROMPT_REFUSAL in (h.error or ""), (h.status, h.error)


def test_http_generate_stream_on_llm(triton_server):
    url = triton_server.grpc_url
    s = llm_stream(url, PROMPT, stream=True, sampling_parameters=GREEDY16).raise_for_error()
    h = http_generate_stream(triton_server.http_base, "llm",
                             {"text_input": PROMPT, "stream": True, "sampling_parameters": sampling_json(GREEDY16),
                              "return_finish_reason": True})
    assert h.status == 200 and h.error is None, h.error
    assert h.text == s.text
    assert h.events[-1]["finish_reason"] == "length"


# -- return_* outputs ------------------------------------------------------------------------------

def test_return_flags_non_streamed(triton_server, count_tokens, tokenizer):
    r = llm_stream(triton_server.grpc_url, PROMPT, stream=False, exclude_input_in_output=True,
                   sampling_parameters=dict(GREEDY16, logprobs="2"), **ALL_FLAGS).raise_for_error()
    assert len(r.responses) == 1
    assert decode_str(r.responses[0], "finish_reason") == "length"
    assert r.last("num_input_tokens").dtype.name == "uint32"
    assert int(scalar(r, "num_input_tokens")) == count_tokens(PROMPT)
    assert int(scalar(r, "num_output_tokens")) == 16
    entries = entries_of(r)
    assert len(entries) == 16
    ids, lps = [], []
    for e in entries:
        # temperature 0: the sampled token is the top-ranked one; 2 alternatives asked (the
        # sampled one among them)
        assert 2 <= len(e) <= 3, e
        ranked = sorted(e.items(), key=lambda kv: kv[1]["rank"])
        assert [v["rank"] for _, v in ranked][:2] == [1, 2], e
        assert all(a["logprob"] >= b["logprob"] for (_, a), (_, b) in zip(ranked, ranked[1:])), e
        tok, top = ranked[0]
        ids.append(int(tok))
        assert top["logprob"] <= 0.0 and math.isfinite(top["logprob"])
        assert isinstance(top["decoded_token"], str)
        lps.append(top["logprob"])
    assert "".join(e[str(i)]["decoded_token"] for i, e in zip(ids, entries)) == r.text
    assert tokenizer.decode(ids, skip_special_tokens=True) == r.text
    cum = float(scalar(r, "cumulative_logprob"))
    assert r.last("cumulative_logprob").dtype.name == "float32"
    assert cum == pytest.approx(sum(lps), abs=1e-3)
    assert cum < 0.0


def test_return_flags_streamed(triton_server, count_tokens):
    r = llm_stream(triton_server.grpc_url, PROMPT, stream=True, sampling_parameters=dict(GREEDY16, logprobs="0"),
                   **ALL_FLAGS).raise_for_error()
    reasons = [decode_str(x, "finish_reason") for x in r.responses]
    assert reasons[-1] == "length"
    assert all(x == "None" for x in reasons[:-1]), reasons  # vLLM: str(None) until the last response
    assert all(int(a.reshape(-1)[0]) == count_tokens(PROMPT) for a in r.all("num_input_tokens"))
    assert sum(int(a.reshape(-1)[0]) for a in r.all("num_output_tokens")) == 16
    entries = entries_of(r)
    assert len(entries) == 16
    assert all(len(e) == 1 and e[next(iter(e))]["rank"] >= 1 for e in entries)  # logprobs 0: rank still there
    total = sum(e[next(iter(e))]["logprob"] for e in entries)
    assert float(scalar(r, "cumulative_logprob")) == pytest.approx(total, abs=1e-3)


def test_flags_absent_gives_only_text(triton_server):
    r = llm_stream(triton_server.grpc_url, PROMPT, stream=False, sampling_parameters=GREEDY16,
                   exclude_input_in_output=True).raise_for_error()
    names = {o.name for o in r.responses[0].get_response().outputs}
    assert "text_output" in names
    assert not names & {"finish_reason", "num_input_tokens", "num_output_tokens", "logprobs", "cumulative_logprob"}


# -- bad sampling_parameters -------------------------------------------------------------------------

@pytest.mark.parametrize("params, field", [
    ({"max_tokens": "4", "no_such_key": "1"}, "no_such_key"),
    ({"max_tokens": "4", "temperature": "abc"}, "temperature"),
    ({"max_tokens": "four"}, "max_tokens"),
    ({"max_tokens": "4", "top_p": "0"}, "top_p"),
    ({"max_tokens": "4", "top_p": "1.5"}, "top_p"),
    ({"max_tokens": "4", "temperature": "-0.5"}, "temperature"),
    ({"max_tokens": "4", "top_k": "-5"}, "top_k"),
    ({"max_tokens": "4", "ignore_eos": "maybe"}, "ignore_eos"),
], ids=["unknown_key", "temperature_abc", "max_tokens_word", "top_p_0", "top_p_1.5", "temperature_neg",
        "top_k_neg", "ignore_eos_word"])
def test_bad_sampling_parameters_name_the_field(triton_server, params, field):
    """One form for unknown keys, type errors and range errors alike: sampling_parameters.<key>."""
    field = f"sampling_parameters.{field}: "
    r = llm_stream(triton_server.grpc_url, PROMPT, stream=True, sampling_parameters=params)
    assert_error_names(r, field)
    h = http_generate(triton_server.http_base, "llm",
                      {"text_input": PROMPT, "sampling_parameters": sampling_json(params)})
    assert h.status == 400, (h.status, h.body)
    assert field in h.error


def test_sampling_parameters_not_json_is_rejected(triton_server):
    r = llm_stream(triton_server.grpc_url, PROMPT, stream=True, sampling_parameters="{temperature: 0")
    assert_error_names(r, "sampling_parameters")


def test_undeclared_inputs_are_refused_naming_them(triton_server):
    """llm declares only the vLLM backend's inputs (and `stop`): token ids are not one of them (the
    ensemble reaches the engine on its own channel), so Triton refuses a client's input_ids by name."""
    ids = np.array([1, 2, 3], dtype=np.int32)
    t = grpcclient.InferInput("input_ids", list(ids.shape), "INT32")
    t.set_data_from_numpy(ids)
    r = grpc_stream(triton_server.grpc_url, "llm", llm_inputs(PROMPT, True, {"max_tokens": "4"}) + [t])
    assert_error_names(r, "input_ids")


def test_numbers_as_json_numbers_also_accepted(triton_server):
    """Values sent as JSON numbers (not strings) give the same result."""
    url = triton_server.grpc_url
    a = llm_stream(url, PROMPT, stream=False, exclude_input_in_output=True,
                   sampling_parameters=GREEDY16).raise_for_error().text
    b = llm_stream(url, PROMPT, stream=False, exclude_input_in_output=True,
                   sampling_parameters=json.dumps({"temperature": 0, "max_tokens": 16})).raise_for_error().text
    assert a == b


# -- stop strings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stop, expected", [(["7"], " 5, 6, "), (["6, 7"], " 5, "), (["zzz", "8,"], " 5, 6, 7, ")],
                         ids=["single_token", "across_tokens", "second_of_list"])
def test_stop_strings(triton_server, stop, expected):
    url = triton_server.grpc_url
    free = llm_stream(url, COUNT_PROMPT, stream=False, exclude_input_in_output=True,
                      sampling_parameters=GREEDY16).raise_for_error().text
    assert free.startswith(" 5, 6, 7, 8,"), f"model output changed, test premise gone: {free!r}"
    params = dict(GREEDY16, stop=stop)
    n = llm_stream(url, COUNT_PROMPT, stream=False, exclude_input_in_output=True, sampling_parameters=params,
                   return_finish_reason=True).raise_for_error()
    assert n.text == expected
    assert decode_str(n.responses[-1], "finish_reason") == "stop"
    s = llm_stream(url, COUNT_PROMPT, stream=True, sampling_parameters=params,
                   return_finish_reason=True).raise_for_error()
    assert s.text == expected
    assert not any(x in d for d in s.texts() for x in stop)
    assert decode_str(s.responses[-1], "finish_reason") == "stop"


def test_two_concurrent_requests_keep_their_own_stop_lists(triton_server):
    url = triton_server.grpc_url

    def run(stop):
        return llm_stream(url, COUNT_PROMPT, stream=True, sampling_parameters=dict(GREEDY16, stop=stop),
                          return_finish_reason=True).raise_for_error()

    a, b, c = run_concurrently([lambda: run(["7"]), lambda: run(["5,"]), lambda: run(["zzz"])])
    assert a.text == " 5, 6, "
    assert b.text == " "
    assert c.text.startswith(" 5, 6, 7, 8,")
    assert [decode_str(x.responses[-1], "finish_reason") for x in (a, b, c)] == ["stop", "stop", "length"]


# -- seeds -------------------------------------------------------------------------------------------

SEEDED = {"temperature": "1.0", "top_p": "1.0", "max_tokens": "16", "seed": "1234"}


def _seeded(url, seed=None, stream=False):
    params = dict(SEEDED) if seed is None else dict(SEEDED, seed=str(seed))
    return llm_stream(url, STORY, stream=stream, exclude_input_in_output=True if not stream else None,
                      sampling_parameters=params).raise_for_error().text


def test_seed_gives_identical_sampled_text(triton_server):
    url = triton_server.grpc_url
    first = _seeded(url)
    assert _seeded(url) == first
    assert _seeded(url, stream=True) == first
    others = {_seeded(url, seed=s) for s in (1, 2, 3)}
    assert others - {first}, "different seeds all gave the same text: sampling does not use the seed"


def test_seed_gives_identical_text_when_batched_with_other_requests(triton_server):
    url = triton_server.grpc_url
    alone = _seeded(url)

    def unseeded():
        return llm_stream(url, STORY, stream=True,
                          sampling_parameters={"temperature": "1.0", "max_tokens": "24"}).raise_for_error().text

    def greedy():
        return llm_stream(url, COUNT_PROMPT, stream=True, sampling_parameters=GREEDY16).raise_for_error().text

    results = run_concurrently([unseeded, lambda: _seeded(url), greedy, unseeded, lambda: _seeded(url, stream=True)])
    assert results[1] == alone
    assert results[4] == alone


# -- last: bad input never kills the server ----------------------------------------------------------

def test_zz_server_still_serves_after_bad_input(triton_server):
    assert server_ready(triton_server.http_base)
    r = llm_stream(triton_server.grpc_url, PROMPT, stream=True, sampling_parameters=GREEDY16,
                   return_finish_reason=True).raise_for_error()
    assert "Paris" in r.text
    assert decode_str(r.responses[-1], "finish_reason") == "length"
