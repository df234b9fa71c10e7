"""The TensorRT-LLM ensemble contract in full width, end to end against the real tritonserver, called
the way TensorRT-LLM's tools/inflight_batcher_llm/end_to_end_grpc_client.py calls it: one gRPC stream
per request, the outputs named explicitly, stop_stream() waiting for the server to close the stream.

- a batched request [3, 1] (--batch-inputs): every row is its own engine request, every response
  names its row in batch_index, and the three answers equal the three prompts sent alone (greedy);
- num_return_sequences 2 (-n 2) at temperature 1: two different texts with sequence_index 0 / 1,
  sequence i equal to a single request with seed + i, the whole reproducible;
- --return-perf-metrics: the ten perf outputs with TensorRT-LLM's types, true values (times from the
  request's life on this host's monotonic clock, kv_cache_reused_blocks from the prefix cache on a
  repeated long prompt), num_input_tokens / num_output_tokens;
- the outputs and inputs such clients name are declared (no "unexpected inference output / input"),
  and the TensorRT-LLM features this engine lacks are refused as INVALID_ARG naming the input."""

from __future__ import annotations

import queue
import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

pytestmark = pytest.mark.e2e

TIMEOUT_S = 180.0
PROMPTS = ["The capital of France is", "Water boils at a temperature of", "The three primary colours are"]
PERF = {"kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32,
        "kv_cache_alloc_total_blocks": np.int32, "arrival_time_ns": np.int64, "first_scheduled_time_ns": np.int64,
        "first_token_time_ns": np.int64, "last_token_time_ns": np.int64, "acceptance_rate": np.float32,
        "total_accepted_draft_tokens": np.int32, "total_draft_tokens": np.int32}
DTYPES = {"text_input": np.object_, "max_tokens": np.int32, "stream": np.bool_, "temperature": np.float32,
          "top_k": np.int32, "seed": np.uint64, "num_return_sequences": np.int32, "beam_width": np.int32,
          "exclude_input_in_output": np.bool_, "return_perf_metrics": np.bool_, "return_num_input_tokens": np.bool_,
          "return_num_output_tokens": np.bool_, "return_log_probs": np.bool_, "return_context_logits": np.bool_,
          "return_generation_logits": np.bool_, "lora_task_id": np.uint64, "guided_decoding_guide_type": np.object_,
          "guided_decoding_guide": np.object_}


def inputs(prompts: list[str], **params) -> list[grpcclient.InferInput]:
    """Every tensor [B, 1], one row per prompt, the same parameters on every row."""
    rows = {"text_input": [[p.encode()] for p in prompts]}
    for k, v in params.items():
        rows[k] = [[v.encode() if isinstance(v, str) else v]] * len(prompts)
    out = []
    for k, v in rows.items():
        arr = np.array(v, dtype=DTYPES[k])
        t = grpcclient.InferInput(k, list(arr.shape), np_to_triton_dtype(arr.dtype))
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def trtllm_client(url: str, tensors, outputs: list[str], request_id: str = "") -> list:
    """As end_to_end_grpc_client.py: start_stream, one async_stream_infer naming its outputs,
    stop_stream() (returns once the server has closed the stream), then every result in order."""
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)

    def run():
        client.start_stream(callback=lambda result, error: q.put(error if error is not None else result))
        client.async_stream_infer("ensemble", tensors, request_id=request_id,
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
        client.stop_stream()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    assert not t.is_alive(), "the stream did not close: the client would hang"
    client.close()
    results = []
    while not q.empty():
        results.append(q.get())
    return results


def ok(results) -> list:
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert not errors, f"server error: {errors[0]}"
    return results


def texts(results, seq: bool = False) -> dict:
    """{batch_index (or (batch_index, sequence_index)): joined text}; batch_index 0 where absent,
    as end_to_end_grpc_client.py reads it."""
    out: dict = {}
    for r in ok(results):
        b = r.as_numpy("batch_index")
        s = r.as_numpy("sequence_index")
        key = 0 if b is None else int(b[0][0])
        if seq:
            key = (key, 0 if s is None else int(s[0][0]))
        out[key] = out.get(key, "") + r.as_numpy("text_output")[0].decode("utf-8")
    return out


GREEDY = dict(max_tokens=16, exclude_input_in_output=True)


@pytest.fixture(scope="module")
def alone(triton_server):
    """Each prompt sent on its own, greedy (no top_k / top_p: TensorRT-LLM decodes greedily)."""
    return [texts(trtllm_client(triton_server.grpc_url, inputs([p], **GREEDY), ["text_output"]))[0] for p in PROMPTS]


@pytest.mark.parametrize("stream", [False, True], ids=["non_streamed", "streamed"])
def test_batched_rows_equal_their_single_requests(triton_server, alone, stream):
    results = trtllm_client(triton_server.grpc_url, inputs(PROMPTS, stream=stream, **GREEDY),
                            ["text_output", "batch_index"])
    got = texts(results)
    assert got == dict(enumerate(alone))
    for r in results:
        b = r.as_numpy("batch_index")
        assert b is not None and b.dtype == np.int32 and b.shape == (1, 1)
        assert r.as_numpy("text_output").shape == (1,)
    if not stream:
        assert len(results) == 3  # one response per row
    assert len(set(alone)) == 3


def test_single_row_has_no_batch_index_and_keeps_its_shape(triton_server, alone):
    results = ok(trtllm_client(triton_server.grpc_url, inputs(PROMPTS[:1], **GREEDY), ["text_output", "batch_index"]))
    assert len(results) == 1 and results[0].as_numpy("batch_index") is None
    assert results[0].as_numpy("text_output").shape == (1,)
    assert results[0].as_numpy("text_output")[0].decode() == alone[0]


SAMPLED = dict(max_tokens=24, temperature=1.0, top_k=50, exclude_input_in_output=True)


@pytest.mark.parametrize("stream", [False, True], ids=["non_streamed", "streamed"])
def test_two_sequences_differ_and_each_is_reproducible_with_its_seed(triton_server, stream):
    url, seed = triton_server.grpc_url, 987654321
    prompt = "Once upon a time, in a small village,"
    outs = ["text_output", "sequence_index"]
    results = ok(trtllm_client(url, inputs([prompt], seed=seed, num_return_sequences=2, stream=stream, **SAMPLED), outs))
    got = texts(results, seq=True)
    assert sorted(got) == [(0, 0), (0, 1)]
    assert got[(0, 0)] != got[(0, 1)], "the two sequences must sample differently"
    for r in results:
        s = r.as_numpy("sequence_index")
        assert s is not None and s.dtype == np.int32 and s.shape == (1, 1)
    if not stream:
        assert len(results) == 2
    # sequence i samples with seed + i: exactly the single request with that seed
    for i in (0, 1):
        single = texts(trtllm_client(url, inputs([prompt], seed=seed + i, **SAMPLED), ["text_output"]))[0]
        assert single == got[(0, i)], f"sequence {i}"
    again = texts(trtllm_client(url, inputs([prompt], seed=seed, num_return_sequences=2, stream=stream, **SAMPLED),
                                outs), seq=True)
    assert again == got


def test_batched_rows_with_two_sequences_each(triton_server):
    results = trtllm_client(triton_server.grpc_url,
                            inputs(PROMPTS[:2], seed=7, num_return_sequences=2, **SAMPLED),
                            ["text_output", "batch_index", "sequence_index"])
    assert sorted(texts(results, seq=True)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(results) == 4


def test_perf_metrics_are_true_values(triton_server, count_tokens):
    """A long prompt twice: the second finds its full KV blocks in the prefix cache."""
    prompt = f"[{uuid.uuid4().hex}] " + " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog."
                                                  for i in range(30))
    n_prompt = count_tokens(prompt)
    assert n_prompt > 3 * 64
    outs = ["text_output", "num_input_tokens", "num_output_tokens", *PERF]
    runs = []
    for _ in range(2):
        t0 = time.monotonic_ns()
        results = ok(trtllm_client(triton_server.grpc_url, inputs([prompt], max_tokens=8, return_perf_metrics=True,
                                                                  return_num_input_tokens=True,
                                                                  return_num_output_tokens=True), outs))
        t1 = time.monotonic_ns()
        assert len(results) == 1
        r = results[0]
        m = {}
        for name, dtype in PERF.items():
            arr = r.as_numpy(name)
            assert arr is not None, f"{name} missing"
            assert arr.dtype == dtype and arr.shape == (1, 1), (name, arr.dtype, arr.shape)
            m[name] = arr[0][0]
        # times from the request's life, on this host's monotonic clock (TensorRT-LLM: steady clock)
        assert t0 <= m["arrival_time_ns"] <= m["first_scheduled_time_ns"] <= m["first_token_time_ns"] \
            <= m["last_token_time_ns"] <= t1, m
        assert m["kv_cache_alloc_total_blocks"] == m["kv_cache_alloc_new_blocks"] + m["kv_cache_reused_blocks"]
        assert m["acceptance_rate"] == 0.0 and m["total_draft_tokens"] == m["total_accepted_draft_tokens"] == 0
        nin, nout = r.as_numpy("num_input_tokens"), r.as_numpy("num_output_tokens")
        assert nin.dtype == np.int32 and nin.shape == (1, 1) and nin[0][0] == n_prompt
        assert nout.dtype == np.int32 and 1 <= nout[0][0] <= 8
        # the blocks that hold the computed tokens (the last sampled token is never computed)
        assert m["kv_cache_alloc_total_blocks"] == -(-(n_prompt + int(nout[0][0]) - 1) // 64)
        runs.append(m)
    assert runs[0]["kv_cache_reused_blocks"] == 0, "a fresh prompt finds nothing in the prefix cache"
    # every full block but the one holding the last prompt token (its logits are needed)
    assert runs[1]["kv_cache_reused_blocks"] == (n_prompt - 1) // 64 > 0


def test_every_tensorrt_llm_output_can_be_requested(triton_server):
    """What end_to_end_grpc_client.py asks for with --batch-inputs -n 2 --return-perf-metrics
    --return-log-probs (context / generation logits are declared too; they are never sent)."""
    outs = ["text_output", "cum_log_probs", "output_log_probs", "sequence_index", "batch_index", *PERF,
            "context_logits", "generation_logits", "num_input_tokens", "num_output_tokens"]
    results = ok(trtllm_client(triton_server.grpc_url,
                               inputs(PROMPTS[:2], max_tokens=4, num_return_sequences=2, temperature=1.0, top_k=5,
                                      return_perf_metrics=True, return_log_probs=True,
                                      return_context_logits=False, return_generation_logits=False), outs))
    assert len(results) == 4
    assert all(r.as_numpy("context_logits") is None for r in results)


def test_guided_decoding_inputs_are_declared(triton_server):
    results = trtllm_client(triton_server.grpc_url,
                            inputs(PROMPTS[:1], max_tokens=8, guided_decoding_guide_type="regex",
                                   guided_decoding_guide="[0-9]+"), ["text_output"])
    errors = [str(r) for r in results if isinstance(r, InferenceServerException)]
    assert not any("unexpected inference input" in e for e in errors), errors


@pytest.mark.parametrize("params, name", [
    (dict(lora_task_id=3), "lora_task_id"),
    (dict(return_context_logits=True), "return_context_logits"),
    (dict(beam_width=2), "beam_width"),
    (dict(num_return_sequences=65), "num_return_sequences"),
])
def test_missing_features_are_invalid_arg_naming_the_input(triton_server, params, name):
    results = trtllm_client(triton_server.grpc_url, inputs(PROMPTS[:1], max_tokens=4, **params), ["text_output"])
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(errors) == 1 and len(results) == 1
    assert name in str(errors[0]) and "in ensemble 'ensemble'" in str(errors[0])
