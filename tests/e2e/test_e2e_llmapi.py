"""`tensorrt_llm`: TensorRT-LLM's Python "llmapi" Triton model contract (docs/contracts/llmapi.md)
against the real tritonserver, called as its own clients call it (llmapi_client.py,
test_llmapi_cancel.py: unary ModelInfer with text_input [1] and sampling_param_* tensors, the `stop`
signal under the same request id, a cancelled future):

- unary gRPC and HTTP: the text equals `llm`'s greedy answer to the same prompt (the llmapi's
  default: greedy, generated text only), with finish_reason, cumulative_logprob (equal to `llm`'s)
  and the perf outputs under its names and dtypes;
- `stop`: for an id in flight the request ends with CANCELLED and its KV blocks are freed; for an id
  not in flight (never sent, or finished) the stop request itself gets CANCELLED; the next request's
  text equals the first's;
- a cancelled gRPC future frees the engine's work;
- refusals name the input: image_url, lora_*, streaming on the non-decoupled model, best_of > 1, a
  bad sampling_param_max_tokens (INVALID_ARG).
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from clients import llm_stream
from metrics_util import is_idle, llm_value, wait_for

pytestmark = pytest.mark.e2e

MODEL = "tensorrt_llm"
PROMPT = "The current time is"
# greedy, this model counts on for hundreds of tokens (a story prompt ends at EOS at once; the llmapi
# contract has no ignore_eos)
COUNT = "Count from 1 to 1000, separated by commas: 1, 2, 3, 4, 5,"


def _t(name: str, arr: np.ndarray, mod=grpcclient):
    t = mod.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


def _inputs(text: str, max_tokens: int | None = None, mod=grpcclient, **flags) -> list:
    ins = [_t("text_input", np.array([text], dtype=object), mod)]
    if max_tokens is not None:
        ins.append(_t("sampling_param_max_tokens", np.array([max_tokens], dtype=np.int32), mod))
    for name, value in flags.items():
        ins.append(_t(name, np.array([value]), mod))
    return ins


def _stop_inputs() -> list:
    return [_t("text_input", np.empty([1], dtype=np.bytes_)), _t("stop", np.array([True]))]


def _async(client, inputs, request_id: str) -> tuple:
    q: queue.Queue = queue.Queue()
    fut = client.async_infer(MODEL, inputs, request_id=request_id, callback=lambda result, error: q.put(error or result))
    return fut, q


def _llm_reference(url: str, text: str, max_tokens: int):
    r = llm_stream(url, text, False, {"temperature": "0", "max_tokens": str(max_tokens)},
                   return_cumulative_logprob=True, exclude_input_in_output=True).raise_for_error()
    return r.text, float(r.last("cumulative_logprob").reshape(-1)[0])


def test_unary_grpc_and_http_answer_as_llm_greedy_with_the_llmapi_outputs(triton_server):
    url = triton_server.grpc_url
    want_text, want_cum = _llm_reference(url, PROMPT, 20)
    with grpcclient.InferenceServerClient(url) as c:
        r = c.infer(MODEL, _inputs(PROMPT, 20, return_finish_reason=True, return_stop_reason=True,
                                   return_cumulative_logprob=True, sampling_param_return_perf_metrics=True),
                    request_id="7")
    assert r.as_numpy("text_output").tolist() == [want_text.encode()]
    assert r.as_numpy("finish_reason").tolist() == [b"length"]
    assert r.as_numpy("stop_reason").tolist() == [b"None"]
    cum = r.as_numpy("cumulative_logprob")
    assert cum.dtype == np.float32 and cum.shape == (1,) and abs(float(cum[0]) - want_cum) < 1e-3
    ints = ("kv_cache_reused_block", "kv_cache_missed_block", "kv_cache_alloc_new_blocks",
            "kv_cache_alloc_total_blocks", "total_accepted_draft_tokens", "total_draft_tokens")
    for name in ints:
        assert r.as_numpy(name).dtype == np.int32, name
    assert r.as_numpy("kv_cache_alloc_total_blocks")[0] == r.as_numpy("kv_cache_alloc_new_blocks")[0] + \
        r.as_numpy("kv_cache_reused_block")[0] >= 1
    assert r.as_numpy("kv_cache_hit_rate").dtype == np.float32
    times = [int(r.as_numpy(n)[0]) for n in ("arrival_time_ns", "first_scheduled_time_ns",
                                              "first_token_time_ns", "last_token_time_ns")]
    assert all(r.as_numpy(n).dtype == np.int64 for n in ("arrival_time_ns", "last_token_time_ns"))
    assert 0 < times[0] <= times[1] <= times[2] <= times[3], times
    # HTTP infer (non-decoupled: one response), default max_tokens 32 of the llmapi's SamplingParams
    want32, _ = _llm_reference(url, PROMPT, 32)
    h = httpclient.InferenceServerClient(triton_server.http_url)
    hr = h.infer(MODEL, _inputs(PROMPT, mod=httpclient))
    assert hr.as_numpy("text_output").tolist() == [want32.encode()]


def test_stop_signal_cancels_the_request_in_flight_and_answers_cancelled(triton_server):
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    with grpcclient.InferenceServerClient(url) as c:
        # an id that was never sent: the stop request itself is CANCELLED
        _, q = _async(c, _stop_inputs(), "41")
        e = q.get(timeout=60)
        assert isinstance(e, InferenceServerException) and e.status() == "StatusCode.CANCELLED", e
        first = c.infer(MODEL, _inputs(PROMPT, 24), request_id="42")
        # a long request, then its stop
        _, q_long = _async(c, _inputs(COUNT, 2000,
                                      sampling_param_temperature=np.float32(0.0)), "43")
        wait_for(murl, lambda m: llm_value(m, "llm_num_requests_running") >= 1, timeout=60)
        _, q_stop = _async(c, _stop_inputs(), "43")
        for q in (q_long, q_stop):
            e = q.get(timeout=60)
            assert isinstance(e, InferenceServerException) and e.status() == "StatusCode.CANCELLED", e
            assert "Request cancelled by client" in e.message()
        wait_for(murl, is_idle, timeout=30)  # the engine let go of it: KV blocks back to 0
        # a stop for the finished id: CANCELLED, and the server answers as before
        _, q = _async(c, _stop_inputs(), "42")
        e = q.get(timeout=60)
        assert isinstance(e, InferenceServerException) and e.status() == "StatusCode.CANCELLED"
        again = c.infer(MODEL, _inputs(PROMPT, 24), request_id="44")
    assert again.as_numpy("text_output").tolist() == first.as_numpy("text_output").tolist()


def test_a_cancelled_future_frees_the_engine(triton_server):
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    before = llm_value(wait_for(murl, is_idle, timeout=60)[0], "llm_requests_total", finish_reason="abort")
    with grpcclient.InferenceServerClient(url) as c:
        fut, q = _async(c, _inputs(COUNT, 2000), "51")
        wait_for(murl, lambda m: llm_value(m, "llm_num_requests_running") >= 1, timeout=60)
        fut.cancel()
        e = q.get(timeout=60)
        assert isinstance(e, InferenceServerException) and "CANCELLED" in str(e.status())
    m, _ = wait_for(murl, lambda m: is_idle(m) and llm_value(m, "llm_requests_total", finish_reason="abort")
                    >= before + 1, timeout=30)


@pytest.mark.parametrize("extra, field", [
    ({"image_url": np.array(["http://example.com/cat.png"], dtype=object)}, "image_url"),
    ({"lora_name": np.array(["adapter"], dtype=object)}, "lora_name"),
    ({"streaming": np.array([True])}, "streaming"),
    ({"sampling_param_best_of": np.array([2], dtype=np.int32)}, "sampling_param_best_of"),
    ({"sampling_param_max_tokens": np.array([0], dtype=np.int32)}, "sampling_param_max_tokens"),
    ({"sampling_param_top_p": np.array([1.5], dtype=np.float32)}, "sampling_param_top_p"),
])
def test_refusals_name_the_input(triton_server, extra, field):
    ins = [_t("text_input", np.array([PROMPT], dtype=object))] + [_t(k, v) for k, v in extra.items()]
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as c:
        with pytest.raises(InferenceServerException) as ei:
            c.infer(MODEL, ins)
    assert ei.value.status() == "StatusCode.INVALID_ARGUMENT", ei.value
    assert ei.value.message().startswith(f"Error generating request: {field}: "), ei.value.message()
