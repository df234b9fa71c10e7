"""The ensemble pipeline (paddle_llm_triton/ensemble_pipeline.py) against a stand-in pb_utils
(pb_standin.py) with stand-in step models, on both Triton generations: 2.51 (no response parameters,
no BLS cancel()) and a newer one (both). Batched rows ([B, 1]) with batch_index, n sequences with
sequence_index, TensorRT-LLM's perf-metric and token-count outputs, refused TensorRT-LLM features,
the FINAL flag on exactly the last response, and cancellation through cancel() or a `stop`."""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import pytest

import pb_standin
from paddle_llm_triton import ensemble_pipeline as ep
from paddle_llm_triton import ensemble_protocol as protocol

PERF = {"kv_cache_alloc_new_blocks": 2, "kv_cache_reused_blocks": 3, "kv_cache_alloc_total_blocks": 5,
        "arrival_time_ns": 100, "first_scheduled_time_ns": 200, "first_token_time_ns": 300,
        "last_token_time_ns": 400, "acceptance_rate": 0.0, "total_accepted_draft_tokens": 0,
        "total_draft_tokens": 0}


def _t(name, arr):
    return pb_standin.Tensor(name, arr)


def install(monkeypatch, newer: bool, gate: threading.Event | None = None):
    """The stand-in module with step models: preprocessing tokenizes to one id per character;
    llm answers every sequence i of a prompt P with "P#i" in two parts ("P", "#i"); postprocessing
    copies. With `gate`, llm waits for it before its second part (cancellation tests)."""
    pb = pb_standin.make(newer)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.setattr("paddle_llm_triton.ensemble_requests._parameters_supported", None)
    pb.stops = []

    def preprocessing(req):
        text = req.tensors["text_input"].reshape(-1)[0]
        if text == b"":
            return pb.InferenceResponse(error=pb.TritonError("text_input: required and must not be empty",
                                                             pb.TritonError.INVALID_ARG))
        assert req.tensors["text_input"].shape == (1, 1), "preprocessing gets one row"
        stream = req.tensors.get("stream", np.array([[False]]))
        return pb.InferenceResponse(output_tensors=[
            _t("INPUT_IDS", np.arange(len(text), dtype=np.int32)),
            _t("SAMPLING_PARAMETERS", np.array([b"{}"], dtype=np.object_)),
            _t("STREAM", stream.reshape(1)), _t("EXCLUDE_INPUT_IN_OUTPUT", np.array([True])),
            _t("RETURN_LOG_PROBS", np.array([False]))])

    def llm(req):
        if "stop" in req.tensors:
            pb.stops.append(req.request_id)
            yield pb.InferenceResponse(output_tensors=[_t("text_output", np.array([b""], np.object_))])
            return
        prompt = req.tensors["text_input"].reshape(-1)[0].decode()
        n = int(req.tensors.get(protocol.NUM_SEQUENCES, np.array([1]))[0])
        perf = protocol.RETURN_PERF_METRICS in req.tensors
        for part in (0, 1):
            if part == 1 and gate is not None:
                assert gate.wait(10)
            for i in range(n):
                text = prompt if part == 0 else f"#{i}"
                ts = [_t("text_output", np.array([text.encode()], np.object_)),
                      _t("finish_reason", np.array([b"length" if part else b""], np.object_)),
                      _t("output_log_probs", np.zeros(1, np.float32)),
                      _t("cumulative_logprob", np.zeros(1, np.float32)),
                      _t(protocol.SEQUENCE_INDEX, np.array([i], np.int32))]
                if perf:
                    ts.append(_t(protocol.PERF_METRICS, np.array([json.dumps(PERF).encode()], np.object_)))
                if "return_num_input_tokens" in req.tensors:
                    ts.append(_t("num_input_tokens", np.array([len(prompt)], np.uint32)))
                if "return_num_output_tokens" in req.tensors:
                    ts.append(_t("num_output_tokens", np.array([1], np.uint32)))
                yield pb.InferenceResponse(output_tensors=ts)

    def postprocessing(req):
        return pb.InferenceResponse(output_tensors=[
            _t("text_output", req.tensors["TEXT_DELTA"].reshape(-1)),
            _t("cum_log_probs", req.tensors["CUM_LOG_PROB"].reshape(-1)),
            _t("output_log_probs", req.tensors["OUTPUT_LOG_PROBS"].reshape(-1))])

    pb.models.update(preprocessing=preprocessing, llm=llm, postprocessing=postprocessing)
    return pb


def client_request(texts, request_id="", **params) -> pb_standin.Request:
    """TensorRT-LLM-style inputs, every tensor [B, 1]."""
    b = len(texts)
    inputs = {"text_input": np.array([[t.encode()] for t in texts], dtype=np.object_)}
    for k, v in params.items():
        inputs[k] = np.array([[v]] * b, dtype=np.int32 if isinstance(v, int) and not isinstance(v, bool) else None)
    return pb_standin.Request(inputs, request_id)


def run(pipe, req) -> list:
    pipe._run(req)
    sent = req.sender.sent
    assert sum(1 for _, f in sent if f) == 1 and sent[-1][1] == 1, "exactly the last response is FINAL"
    return sent


def by_row_and_seq(sent) -> dict:
    texts: dict = {}
    for r, _ in sent:
        if r is None:
            continue
        assert not r.has_error(), r.error().message()
        b = r.output("batch_index")
        s = r.output("sequence_index")
        key = (None if b is None else int(b[0, 0]), None if s is None else int(s[0, 0]))
        texts[key] = texts.get(key, "") + r.output("text_output")[0].decode()
    return texts


@pytest.fixture
def pipe():
    p = ep.EnsemblePipeline(poll_s=0.02, retry_s=0.2, give_up_s=5)
    yield p
    p.shutdown()


@pytest.mark.parametrize("newer", [False, True])
def test_batched_rows_carry_batch_index_and_end_with_one_final(monkeypatch, pipe, newer):
    pb = install(monkeypatch, newer)
    sent = run(pipe, client_request(["ab", "cde", "f"]))
    assert by_row_and_seq(sent) == {(0, None): "ab#0", (1, None): "cde#0", (2, None): "f#0"}
    for r, _ in sent:
        if r is not None:
            assert r.output("batch_index").dtype == np.int32 and r.output("batch_index").shape == (1, 1)
    llm_calls = [c for name, c in pb.calls if name == "llm"]
    assert len(llm_calls) == 3 and len({c.request_id for c in llm_calls}) == 3  # a request per row
    assert all(protocol.NUM_SEQUENCES not in c.tensors for c in llm_calls)


@pytest.mark.parametrize("newer", [False, True])
def test_one_row_is_as_before_and_response_parameters_only_where_supported(monkeypatch, pipe, newer):
    install(monkeypatch, newer)
    sent = run(pipe, client_request(["hello"]))
    data = [r for r, _ in sent if r is not None]
    assert by_row_and_seq(sent) == {(None, None): "hello#0"}
    assert all(r.output("batch_index") is None and r.output("sequence_index") is None for r in data)
    assert data[-1].output("text_output").shape == (1,)
    if newer:
        assert data[0].parameters == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
        assert data[-1].parameters["finish_reason"] == "length"
    else:
        assert all(r.parameters is None for r in data)


def test_n_sequences_carry_sequence_index_per_row(monkeypatch, pipe):
    pb = install(monkeypatch, newer=True)
    sent = run(pipe, client_request(["xy", "z"], num_return_sequences=2))
    assert by_row_and_seq(sent) == {(0, 0): "xy#0", (0, 1): "xy#1", (1, 0): "z#0", (1, 1): "z#1"}
    llm_calls = [c for name, c in pb.calls if name == "llm"]
    assert all(int(c.tensors[protocol.NUM_SEQUENCES][0]) == 2 for c in llm_calls)
    for r, _ in sent:
        if r is not None:
            assert r.output("sequence_index").dtype == np.int32 and r.output("sequence_index").shape == (1, 1)


def test_perf_metrics_and_token_counts_with_tensorrt_llm_types(monkeypatch, pipe):
    install(monkeypatch, newer=False)
    req = client_request(["abc"], return_perf_metrics=True, return_num_input_tokens=True,
                         return_num_output_tokens=True)
    sent = run(pipe, req)
    last = [r for r, _ in sent if r is not None][-1]
    for name, dtype in protocol.PERF_OUTPUTS:
        arr = last.output(name)
        assert arr is not None and arr.shape == (1, 1) and arr.dtype == np.dtype(dtype), name
        assert arr[0, 0] == PERF[name], name
    assert last.output("num_input_tokens").dtype == np.int32 and last.output("num_input_tokens")[0, 0] == 3
    assert last.output("num_output_tokens")[0, 0] == 1
    plain = run(pipe, client_request(["abc"]))
    assert all(r.output("kv_cache_reused_blocks") is None for r, _ in plain if r is not None)


@pytest.mark.parametrize("name, value", [
    ("lora_task_id", np.array([[7]], np.uint64)),
    ("return_context_logits", np.array([[True]])),
    ("embedding_bias_words", np.array([[b"x"]], np.object_)),
])
def test_unsupported_tensorrt_llm_features_are_invalid_arg(monkeypatch, pipe, name, value):
    pb = install(monkeypatch, newer=True)
    req = pb_standin.Request({"text_input": np.array([[b"hi"]], np.object_), name: value})
    sent = run(pipe, req)
    err = sent[-1][0].error()
    assert err.code() == pb.TritonError.INVALID_ARG and name in err.message()
    assert err.message().startswith("in ensemble 'ensemble', ")
    assert not [c for n, c in pb.calls if n == "llm"]


def test_false_logit_flags_are_accepted(monkeypatch, pipe):
    install(monkeypatch, newer=True)
    req = pb_standin.Request({"text_input": np.array([[b"hi"]], np.object_),
                              "return_context_logits": np.array([[False]]),
                              "return_generation_logits": np.array([[False]])})
    assert by_row_and_seq(run(pipe, req)) == {(None, None): "hi#0"}


def test_a_bad_row_fails_the_request_before_anything_is_generated(monkeypatch, pipe):
    pb = install(monkeypatch, newer=True)
    sent = run(pipe, client_request(["ok", ""]))
    assert len(sent) == 1 and "text_input" in sent[0][0].error().message()
    assert not [c for n, c in pb.calls if n == "llm"]


@pytest.mark.parametrize("newer", [False, True])
def test_cancellation_uses_cancel_where_the_iterator_has_it(monkeypatch, pipe, newer):
    gate = threading.Event()
    pb = install(monkeypatch, newer, gate)
    req = client_request(["slow", "rows"], request_id="client-1")
    pipe.submit(req)
    deadline = time.monotonic() + 5
    while len(req.sender.sent) < 2 and time.monotonic() < deadline:  # the first part of each row
        time.sleep(0.01)
    req.sender.cancelled = True
    llm_calls = [c for n, c in pb.calls if n == "llm" and "stop" not in c.tensors]
    inner = {c.request_id for c in llm_calls}
    deadline = time.monotonic() + 5
    if newer:  # cancel() on both rows' iterators, no stop request needed
        while not all(c.iterator.cancelled.is_set() for c in llm_calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(c.iterator.cancelled.is_set() for c in llm_calls)
        assert pb.stops == []
    else:  # 2.51: a stop request with each inner request's id
        while set(pb.stops) != inner and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(pb.stops) == inner
    gate.set()
    assert req.sender.done.wait(5)
    assert req.sender.sent[-1] == (None, 1)  # nothing more than the closing final after the cancel
    assert len(req.sender.sent) == 3


def test_stop_request_stops_every_row_of_the_client_request(monkeypatch, pipe):
    gate = threading.Event()
    pb = install(monkeypatch, newer=True, gate=gate)
    req = client_request(["a", "b"], request_id="same-id")
    pipe.submit(req)
    deadline = time.monotonic() + 5
    while len(req.sender.sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop = pb_standin.Request({"text_input": np.array([[b""]], np.object_), "stop": np.array([[True]])},
                              "same-id")
    pipe._run(stop)
    assert stop.sender.sent[-1][1] == 1 and not stop.sender.sent[-1][0].has_error()
    inner = {c.request_id for n, c in pb.calls if n == "llm" and "stop" not in c.tensors}
    assert set(pb.stops) == inner and len(inner) == 2
    gate.set()
    assert req.sender.done.wait(5)


def test_client_timeout_goes_on_to_every_llm_request_of_its_rows(monkeypatch, pipe):
    """gRPC timeout= (request.timeout()) or HTTP generate's "timeout" parameter: each row's llm BLS
    request carries it, so the engine enforces the client's deadline; a malformed one is INVALID_ARG."""
    pb = install(monkeypatch, False)
    req = client_request(["ab", "c"])
    req._timeout = 2_500_000
    run(pipe, req)
    assert [c.timeout for name, c in pb.calls if name == "llm"] == [2_500_000, 2_500_000]
    req = client_request(["ab"])
    req._parameters = '{"timeout": 700000}'
    run(pipe, req)
    assert [c.timeout for name, c in pb.calls if name == "llm"][-1] == 700_000
    req = client_request(["ab"])
    req._parameters = '{"timeout": "soon"}'
    sent = run(pipe, req)
    (err, _), = sent
    assert err.error().code() == pb.TritonError.INVALID_ARG and err.error().message().startswith(
        "in ensemble 'ensemble', timeout: ")
