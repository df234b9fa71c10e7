"""Model `llm` the way the Triton vLLM backend's own README and CI call it:

- sampling parameters as Triton request parameters (the README quick-start body on HTTP `generate`
  and `generate_stream`; gRPC `parameters=`), the `sampling_parameters` tensor winning when both
  are sent, and the same error texts on both paths;
- the additional outputs exactly as that backend's CI (ci/L0_additional_outputs_vllm) checks them,
  on a server with `default_max_tokens` 16 (vLLM's default: the CI expects "length" after it);
- the EOS token's logprob entry agreeing with text_output; SamplingParams keys of vLLM that clients
  send (include_stop_str_in_output, logit_bias, allowed_token_ids, truncate_prompt_tokens) and the
  known ones that are refused as such."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from clients import _tensor, decode_str, is_final, llm_stream, sampling_json, scrape_metrics
from metrics_util import is_idle, wait_for
from http_clients import http_generate, http_generate_stream
from repo_edit import set_config_parameter

pytestmark = pytest.mark.e2e

PROMPT = "What is Triton Inference Server?"
# the vLLM backend's README quick start, with max_tokens as the body
QUICK_START = {"text_input": PROMPT, "parameters": {"stream": False, "temperature": 0, "max_tokens": 20}}


def _greedy_reference(url, n, ignore_eos):
    """The same request through the sampling_parameters tensor (gRPC), non-streamed, prompt excluded."""
    sp = {"temperature": "0", "max_tokens": str(n), "ignore_eos": "true" if ignore_eos else "false"}
    r = llm_stream(url, PROMPT, stream=False, sampling_parameters=sp, exclude_input_in_output=True,
                   return_num_output_tokens=True).raise_for_error()
    return r.text, int(r.last("num_output_tokens").reshape(-1)[0])


def test_quick_start_body_on_generate_is_greedy_and_20_tokens(triton_server, count_tokens):
    base, url = triton_server.http_base, triton_server.grpc_url
    ref_text, ref_n = _greedy_reference(url, 20, ignore_eos=False)
    h = http_generate(base, "llm", QUICK_START)
    assert h.status == 200, h.body
    assert h.body["text_output"] == PROMPT + ref_text  # greedy (temperature 0) and max_tokens 20 honoured
    assert ref_n <= 20
    # ignoring EOS to count: exactly 20 tokens (return_num_output_tokens as a top-level key = the input)
    body = {**QUICK_START, "parameters": {**QUICK_START["parameters"], "ignore_eos": True},
            "return_num_output_tokens": True}
    h = http_generate(base, "llm", body)
    assert h.status == 200, h.body
    assert h.body["num_output_tokens"] == 20
    eos_text, _ = _greedy_reference(url, 20, ignore_eos=True)
    assert h.body["text_output"] == PROMPT + eos_text


def test_quick_start_body_on_generate_stream_answers_at_once(triton_server):
    """The issue: this body on generate_stream produced nothing for 60 s. The parameters were not
    read, so max_tokens defaulted to max_model_len - prompt tokens at temperature 1, and stream false
    (Triton turns the `stream` parameter into the input) means one response at the end."""
    base, url = triton_server.http_base, triton_server.grpc_url
    body = {**QUICK_START, "parameters": {**QUICK_START["parameters"], "ignore_eos": True},
            "return_num_output_tokens": True, "return_finish_reason": True}
    h = http_generate_stream(base, "llm", body, timeout=60)
    assert h.status == 200 and h.error is None, h.error
    assert len(h.events) == 1, h.events  # not streamed: one event
    ev = h.events[0]
    assert ev["num_output_tokens"] == 20 and ev["finish_reason"] == "length"
    ref, _ = _greedy_reference(url, 20, ignore_eos=True)
    assert ev["text_output"] == PROMPT + ref
    # "stream": true in the parameters streams (and the prompt is not repeated)
    body["parameters"]["stream"] = True
    h = http_generate_stream(base, "llm", body, timeout=60)
    assert h.status == 200 and h.error is None, h.error
    assert len(h.events) > 1
    assert h.text == ref and sum(e["num_output_tokens"] for e in h.events) == 20
    assert [e["finish_reason"] for e in h.events[:-1]] == ["None"] * (len(h.events) - 1)


def _grpc_with_parameters(url, inputs, parameters, timeout=60):
    """One request with Triton request parameters (tritonclient's parameters=), as the vLLM CI sends."""
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer("llm", inputs, parameters=parameters, enable_empty_final_response=True)
        results = []
        while True:
            result, err = q.get(timeout=timeout)
            if err is not None:
                return results, err
            if result.get_response().outputs:
                results.append(result)
            if is_final(result):
                return results, None
    finally:
        client.stop_stream()
        client.close()


def _text_input():
    return _tensor("text_input", np.array([PROMPT.encode()], dtype=np.object_))


def test_grpc_request_parameters_including_stream(triton_server):
    """gRPC parameters are not turned into inputs by Triton: `stream` is read from them too."""
    url = triton_server.grpc_url
    res, err = _grpc_with_parameters(url, [_text_input()], {"stream": True, "temperature": 0, "max_tokens": 8,
                                                            "ignore_eos": True})
    assert err is None, err
    assert len(res) > 1
    ref, _ = _greedy_reference(url, 8, ignore_eos=True)
    assert "".join(decode_str(r, "text_output") for r in res) == ref


def test_the_sampling_parameters_tensor_wins_over_request_parameters(triton_server):
    """The vLLM backend's rule (src/utils/request.py): request.parameters() is read only when no
    sampling_parameters tensor is sent."""
    url, base = triton_server.grpc_url, triton_server.http_base
    sp = _tensor("sampling_parameters", np.array([b'{"temperature": "0", "max_tokens": "4", "ignore_eos": "true"}'],
                                                 dtype=np.object_))
    n_out = _tensor("return_num_output_tokens", np.array([True]))
    res, err = _grpc_with_parameters(url, [_text_input(), sp, n_out], {"max_tokens": 9, "temperature": 1.0})
    assert err is None, err
    assert int(res[-1].as_numpy("num_output_tokens")[0]) == 4
    h = http_generate(base, "llm", {"text_input": PROMPT, "return_num_output_tokens": True,
                                    "sampling_parameters": sampling_json({"max_tokens": 4, "ignore_eos": True,
                                                                          "temperature": 0}),
                                    "parameters": {"max_tokens": 9, "no_such_key": 1}})
    assert h.status == 200, h.body
    assert h.body["num_output_tokens"] == 4


@pytest.mark.parametrize("params, key", [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                                         ({"max_tokens": "four"}, "max_tokens"), ({"temprature": 0}, "temprature"),
                                         ({"prompt_logprobs": 1}, "prompt_logprobs")])
def test_request_parameter_errors_have_the_tensor_paths_text(triton_server, params, key):
    base = triton_server.http_base
    h_param = http_generate(base, "llm", {"text_input": PROMPT, "parameters": params})
    h_tensor = http_generate(base, "llm", {"text_input": PROMPT, "sampling_parameters": json.dumps(params)})
    assert h_param.status == h_tensor.status == 400
    assert h_param.error == h_tensor.error
    assert f"sampling_parameters.{key}: " in h_param.error, h_param.error


def test_eos_decoded_token_agrees_with_text_output(triton_server, chat_prompt):
    """skip_special_tokens (default true) drops <|im_end|> from text_output; its logprob entry's
    decoded_token is "" too, so the sampled tokens' decoded_tokens join to text_output."""
    url = triton_server.grpc_url
    for skip in (True, False):
        r = llm_stream(url, chat_prompt("What is the capital of France?"), stream=False,
                       exclude_input_in_output=True, return_logprobs=True, return_finish_reason=True,
                       sampling_parameters={"temperature": "0", "max_tokens": "64", "logprobs": "0",
                                            "skip_special_tokens": str(skip).lower()}).raise_for_error()
        assert decode_str(r.responses[-1], "finish_reason") == "stop", "the answer did not end with EOS"
        entries = json.loads(r.last("logprobs").reshape(-1)[0])
        chosen = [next(iter(e.values())) for e in entries]
        assert all(c["rank"] >= 1 for c in chosen)
        assert chosen[-1]["decoded_token"] == ("" if skip else "<|im_end|>")
        assert "".join(c["decoded_token"] for c in chosen) == r.text


def test_vllm_sampling_keys_end_to_end(triton_server, tokenizer, count_tokens):
    url = triton_server.grpc_url
    count = "1, 2, 3, 4,"
    greedy = {"temperature": "0", "max_tokens": "16"}
    free = llm_stream(url, count, stream=False, exclude_input_in_output=True,
                      sampling_parameters=greedy).raise_for_error().text
    assert free.startswith(" 5, 6, 7"), f"model output changed, test premise gone: {free!r}"
    inc = llm_stream(url, count, stream=True, sampling_parameters=dict(greedy, stop=["7"],
                                                                       include_stop_str_in_output="true"))
    assert inc.raise_for_error().text == " 5, 6, 7"
    # logit_bias / allowed_token_ids: a token the model would not pick, then only that token
    x = tokenizer.encode(" x", add_special_tokens=False)
    x = (x["input_ids"] if hasattr(x, "keys") else x)[0]
    biased = llm_stream(url, count, stream=False, exclude_input_in_output=True,
                        sampling_parameters=json.dumps({"temperature": 0, "max_tokens": 3, "ignore_eos": True,
                                                        "logit_bias": {str(x): 100}})).raise_for_error().text
    assert biased == " x x x"
    only = llm_stream(url, count, stream=False, exclude_input_in_output=True,
                      sampling_parameters=json.dumps({"temperature": 1.0, "seed": 5, "max_tokens": 4,
                                                      "ignore_eos": True, "allowed_token_ids": [x]})).raise_for_error()
    assert only.text == " x x x x"
    # truncate_prompt_tokens: the prompt's last k tokens only
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 4 + count
    n = count_tokens(long_prompt)
    t = llm_stream(url, long_prompt, stream=False, exclude_input_in_output=True, return_num_input_tokens=True,
                   sampling_parameters=dict(greedy, truncate_prompt_tokens="6")).raise_for_error()
    assert n > 6 and int(t.last("num_input_tokens").reshape(-1)[0]) == 6


# -- the vLLM backend's published CI expectations ------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_default_server(triton_server_factory):
    """llm alone with default_max_tokens 16: vLLM's SamplingParams default, which the vLLM backend's CI
    relies on (its last finish_reason is "length" without max_tokens being sent)."""
    return triton_server_factory(lambda repo: set_config_parameter(repo / "llm" / "config.pbtxt",
                                                                   "default_max_tokens", "16"), models=["llm"])


# That CI's additional-outputs prompt is "In this example,"; on SmolLM2 it ends with EOS after 14
# tokens (finish_reason "stop"; its CI model, OPT-125m, runs to 16), so this is another prompt of the
# same CI (ci/L0_backend_vllm/vllm_backend/vllm_backend_test.py PROMPTS) that runs past 16 tokens.
VLLM_CI_PROMPT = "The future of AI is"
VLLM_CI_SAMPLING = {"temperature": "0", "top_p": "1"}


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("logprobs", [None, 0, 2])
@pytest.mark.parametrize("flags", [True, None], ids=["all_flags", "no_flags"])
def test_additional_outputs_as_the_vllm_backend_ci_checks_them(vllm_default_server, stream, logprobs, flags):
    """Written from triton-inference-server/vllm_backend ci/L0_additional_outputs_vllm/
    additional_outputs_test.py (its client, prompt and sampling parameters; the request also carries
    them as request parameters, as that test does), not from this server's output. Its expectations:

    - finish_reason: `if i < len(self._responses) - 1: assert finish_reason == "None"`
      `else: assert finish_reason == "length"`; absent (None) unless return_finish_reason;
    - cumulative_logprob: `assert cumulative_logprob != prev_cumulative_logprob` from one response to
      the next (it is cumulative);
    - logprobs: `if "logprobs" not in sampling_parameters: assert logprobs is None`; else a list with
      `len(logprobs) == num_output_tokens`, each entry a dict of `1 <= len(logprobs_d) <=
      sampling_parameters["logprobs"] + 1` items `{"logprob": float, "rank": int, "decoded_token":
      str}` (`len(logprob_d) == 3`), exactly one of rank 1, and the rank-1 decoded_tokens joined equal
      text_output (`text_output_logprobs = self._prompt + text_output_logprobs` when not streaming);
    - `num_input_tokens > 0` and `<= len(self._prompt)`; `num_output_tokens > 0`;
    - `text_output.count(" ") > 4` over all responses ("output is not a sentence")."""
    sampling = dict(VLLM_CI_SAMPLING)
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    inputs = [_tensor("text_input", np.array([VLLM_CI_PROMPT.encode()], dtype=np.object_)),
              _tensor("stream", np.array([stream], dtype=bool)),
              _tensor("sampling_parameters", np.array([json.dumps(sampling).encode()], dtype=np.object_))]
    for name in ("return_finish_reason", "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens",
                 "return_num_output_tokens"):
        if flags is not None:
            inputs.append(_tensor(name, np.array([flags], dtype=bool)))
    res, err = _grpc_with_parameters(vllm_default_server.grpc_url, inputs, sampling)
    assert err is None, err
    assert len(res) > 0
    if not stream:
        assert len(res) == 1
    text = "".join(r.as_numpy("text_output")[0].decode() for r in res)
    assert len(text) > 0 and text.count(" ") > 4
    prev_cum = 0.0
    for i, r in enumerate(res):
        fr, cum, lp = r.as_numpy("finish_reason"), r.as_numpy("cumulative_logprob"), r.as_numpy("logprobs")
        nin, nout = r.as_numpy("num_input_tokens"), r.as_numpy("num_output_tokens")
        if not flags:
            assert fr is None and cum is None and lp is None and nin is None and nout is None
            continue
        assert fr[0].decode() == ("None" if i < len(res) - 1 else "length")
        c = float(cum[0])
        assert c != prev_cum
        prev_cum = c
        assert 0 < int(nin.reshape(-1)[0]) <= len(VLLM_CI_PROMPT)
        assert int(nout[0]) > 0
        entries = json.loads(lp[0].decode())
        if logprobs is None:
            assert entries is None
            continue
        assert isinstance(entries, list) and len(entries) == int(nout[0])
        joined = ""
        for d in entries:
            assert 1 <= len(d) <= logprobs + 1
            ones = [v for v in d.values() if v["rank"] == 1]
            assert len(ones) == 1
            for tok, v in d.items():
                assert isinstance(tok, str) and len(v) == 3
                assert isinstance(v["logprob"], float) and isinstance(v["rank"], int)
                assert isinstance(v["decoded_token"], str)
            joined += ones[0]["decoded_token"]
        out = r.as_numpy("text_output")[0].decode()
        assert (joined if stream else VLLM_CI_PROMPT + joined) == out


def test_default_max_tokens_16_applies_to_requests_without_max_tokens(vllm_default_server):
    """The vLLM backend's CI expects 16 tokens by default (its vllm_backend_test.py expected outputs
    are 16 tokens long); a request that sends max_tokens keeps it."""
    url = vllm_default_server.grpc_url
    r = llm_stream(url, VLLM_CI_PROMPT, stream=False, return_num_output_tokens=True,
                   sampling_parameters={"temperature": "0", "ignore_eos": "true"}).raise_for_error()
    assert int(r.last("num_output_tokens").reshape(-1)[0]) == 16
    r = llm_stream(url, VLLM_CI_PROMPT, stream=False, return_num_output_tokens=True,
                   sampling_parameters={"temperature": "0", "ignore_eos": "true", "max_tokens": "20"}).raise_for_error()
    assert int(r.last("num_output_tokens").reshape(-1)[0]) == 20
    h = requests.post(f"{vllm_default_server.http_base}/v2/models/llm/generate",
                      json={"text_input": VLLM_CI_PROMPT, "parameters": {"temperature": 0, "ignore_eos": True},
                            "return_num_output_tokens": True}, timeout=60).json()
    assert h["num_output_tokens"] == 16


def _sampled(url, n, seed, stream):
    sp = {"temperature": "1.0", "top_k": "20", "max_tokens": "12", "seed": str(seed), "n": str(n)}
    return llm_stream(url, PROMPT, stream=stream, sampling_parameters=sp, exclude_input_in_output=True,
                      return_finish_reason=True, return_num_output_tokens=True).raise_for_error()


def test_n_2_answers_in_the_vllm_backend_form_and_counts_request_params_n(triton_server):
    """n = 2 as the vLLM backend serves it: text_output and the per-sequence outputs carry 2 entries,
    entry i for sequence i, which samples with seed + i (so it equals an n = 1 request with that seed);
    non-streamed: one response; streamed: each response's deltas at their index. The vLLM backend's
    metrics test reads vllm:request_params_n after such a request."""
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    before = scrape_metrics(murl)
    alone = [_sampled(url, 1, 100 + i, False).text for i in range(2)]
    r = _sampled(url, 2, 100, False)
    assert len(r.responses) == 1
    texts = [t.decode() for t in r.responses[0].as_numpy("text_output").tolist()]
    assert texts == alone and texts[0] != texts[1]
    assert r.responses[0].as_numpy("finish_reason").shape == (2,)
    assert r.responses[0].as_numpy("num_output_tokens").tolist() == [12, 12]
    s = _sampled(url, 2, 100, True)
    joined = ["", ""]
    for resp in s.responses:
        out = resp.as_numpy("text_output").tolist()
        assert len(out) == 2
        for i in range(2):
            joined[i] += out[i].decode()
    assert joined == alone
    # HTTP generate: one JSON answer with both texts
    body = {"text_input": PROMPT, "parameters": {"stream": False, "temperature": 1.0, "top_k": 20, "max_tokens": 12,
                                                 "seed": 100, "n": 2, "exclude_input_in_output": True}}
    h = http_generate(triton_server.http_base, "llm", body)
    assert h.status == 200 and h.body["text_output"] == alone, h.body
    count = "vllm:request_params_n_count"
    # the metrics thread records a request after its final response left: wait for all five (and idle)
    after, _ = wait_for(murl, lambda m: m.value(count) - before.value(count) >= 5 and is_idle(m), timeout=10)
    assert after.value(count) - before.value(count) == 5  # 2 alone, 3 with n = 2
    assert after.value("vllm:request_params_n_sum") - before.value("vllm:request_params_n_sum") == 2 + 3 * 2
    assert after.value("vllm:request_params_n_bucket", le="1") - before.value(
        "vllm:request_params_n_bucket", le="1") == 2
    assert after.value("vllm:request_params_max_tokens_sum") - before.value("vllm:request_params_max_tokens_sum") \
        == 5 * 12
