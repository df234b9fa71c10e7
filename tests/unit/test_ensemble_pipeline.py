"""The ensemble pipeline (paddle_llm_triton/ensemble/pipeline.py) against a stand-in pb_utils
(pb_standin.py) with stand-in preprocessing / postprocessing models and a fake engine behind a real
engine channel, on both Triton generations: 2.51 (no response parameters) and a newer one. Batched
rows ([B, 1]) with batch_index, n sequences with sequence_index, TensorRT-LLM's perf-metric and
token-count outputs, TensorRT-LLM's LoRA inputs carried per row, refused TensorRT-LLM features, the FINAL flag on exactly the last response,
cancellation and the `stop` signal as aborts on the channel, and an llm instance that dies or is
not there."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time

import numpy as np
import pytest

import pb_standin
from paddle_llm_triton.ensemble import pipeline as ep
from paddle_llm_triton.engine_channel import protocol
from paddle_llm_triton.engine_channel.client import ChannelClient
from paddle_llm_triton.engine_channel.server import ChannelServer

PERF = {"kv_cache_alloc_new_blocks": 2, "kv_cache_reused_blocks": 3, "kv_cache_alloc_total_blocks": 5,
        "arrival_time_ns": 100, "first_scheduled_time_ns": 200, "first_token_time_ns": 300,
        "last_token_time_ns": 400, "acceptance_rate": 0.0, "total_accepted_draft_tokens": 0,
        "total_draft_tokens": 0}
_pids = itertools.count(20_000_000 + os.getpid() * 100)


def _t(name, arr):
    return pb_standin.Tensor(name, arr)


class FakeEngine:
    """The llm side: answers every sequence i of a prompt P (its ids are the characters' codes)
    with "P#i" in two frames ("P", "#i"); with `gate` it waits for it before the second frame and
    ends a request aborted meanwhile with finish_reason "abort"."""

    def __init__(self, gate: threading.Event | None = None):
        self.gate = gate
        self.starts: list[dict] = []
        self.aborted: list[str] = []
        self.lock = threading.Lock()

    def start(self, msg, emit):
        with self.lock:
            rid = f"r{len(self.starts)}"
            self.starts.append(msg)
        threading.Thread(target=self._run, args=(rid, msg, emit), daemon=True).start()
        return rid

    def abort(self, rid):
        with self.lock:
            self.aborted.append(rid)

    def _frame(self, msg, i, text, reason, finished):
        f = {"type": "output", "seq": i, "text": text, "ids": [1], "logprobs": [0.0], "cum": 0.0,
             "finish_reason": reason, "seq_finished": bool(reason), "finished": finished,
             "num_prompt_tokens": len(msg["prompt_ids"]), "num_output_tokens": 1}
        if msg.get("perf"):
            f["perf"] = PERF
        return f

    def _run(self, rid, msg, emit):
        prompt = "".join(chr(c) for c in msg["prompt_ids"])
        n = msg.get("n", 1)
        for i in range(n):
            emit(self._frame(msg, i, prompt, "", False), False)
        if self.gate is not None:
            while not self.gate.wait(0.01):
                if rid in self.aborted:
                    emit(self._frame(msg, 0, "", "abort", True), True)
                    return
        for i in range(n):
            last = i == n - 1
            emit(self._frame(msg, i, f"#{i}", "length", last), last)


def install(monkeypatch, newer: bool, gate: threading.Event | None = None, coalesce: bool = True):
    """The stand-in module with the step models (preprocessing: one id per character; postprocessing
    copies) and a fake llm instance on the engine channel. Returns (pb, pipeline, engine)."""
    pb = pb_standin.make(newer)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.setattr("paddle_llm_triton.ensemble.requests._parameters_supported", None)

    def preprocessing(req):
        text = req.tensors["text_input"].reshape(-1)[0]
        if text == b"":
            return pb.InferenceResponse(error=pb.TritonError("text_input: required and must not be empty",
                                                             pb.TritonError.INVALID_ARG))
        assert req.tensors["text_input"].shape == (1, 1), "preprocessing gets one row"
        stream = req.tensors.get("stream", np.array([[False]]))
        return pb.InferenceResponse(output_tensors=[
            _t("INPUT_IDS", np.array([ord(c) for c in text.decode()], dtype=np.int32)),
            _t("SAMPLING_PARAMETERS", np.array([b"{}"], dtype=np.object_)),
            _t("STREAM", stream.reshape(1)), _t("EXCLUDE_INPUT_IN_OUTPUT", np.array([True])),
            _t("RETURN_LOG_PROBS", np.array([False]))])

    def postprocessing(req):
        return pb.InferenceResponse(output_tensors=[
            _t("text_output", req.tensors["TEXT_DELTA"].reshape(-1)),
            _t("cum_log_probs", req.tensors["CUM_LOG_PROB"].reshape(-1)),
            _t("output_log_probs", req.tensors["OUTPUT_LOG_PROBS"].reshape(-1))])

    pb.models.update(preprocessing=preprocessing, postprocessing=postprocessing)
    pid = next(_pids)
    engine = FakeEngine(gate)
    server = ChannelServer("llm", "llm_0_0", engine, pid=pid)
    pipe = ep.EnsemblePipeline(poll_s=0.02, give_up_s=5, channel=ChannelClient("llm", pid=pid), coalesce=coalesce)
    pipe._test_server = server
    return pb, pipe, engine


@pytest.fixture
def cleanup():
    pipes = []
    yield pipes.append
    for p in pipes:
        p.shutdown()
        p._test_server.close()


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


@pytest.mark.parametrize("newer", [False, True])
def test_batched_rows_carry_batch_index_and_end_with_one_final(monkeypatch, cleanup, newer):
    pb, pipe, eng = install(monkeypatch, newer)
    cleanup(pipe)
    sent = run(pipe, client_request(["ab", "cde", "f"]))
    assert by_row_and_seq(sent) == {(0, None): "ab#0", (1, None): "cde#0", (2, None): "f#0"}
    for r, _ in sent:
        if r is not None:
            assert r.output("batch_index").dtype == np.int32 and r.output("batch_index").shape == (1, 1)
    assert sorted(tuple(m["prompt_ids"]) for m in eng.starts) == sorted(
        tuple(map(ord, t)) for t in ("ab", "cde", "f"))  # an engine request per row
    assert all(m["n"] == 1 for m in eng.starts)
    assert not [c for name, c in pb.calls if name == "llm"], "no BLS call to llm"


def test_a_finished_request_leaves_no_garbage_holding_its_response_sender(monkeypatch, cleanup):
    # A client request and its rows refer to each other; left so, the response sender is freed only
    # by the garbage collector, which may first run at the stub's exit, after the stub that the
    # sender's clean-up reaches for is gone: a segmentation fault at every unload of `ensemble`.
    import gc

    from paddle_llm_triton.ensemble.requests import ClientRequest, Flight
    from paddle_llm_triton.lifecycle.senders import TrackedSender

    _, pipe, _ = install(monkeypatch, False)
    cleanup(pipe)
    gc.collect()
    gc.disable()  # what refcounting alone frees: gc.get_objects() still lists uncollected cycles
    try:
        for texts in (["ab", "cde"], ["x"]):
            run(pipe, client_request(texts))
        # A cancellation sweep in progress holds the requests it checks until it returns: wait for
        # refcounting to free them. A cycle is never freed with the collector off, nor a reference
        # kept for good (the watcher's loop variable once kept the last request: 1 run in 3 failed
        # on a loaded host), so this still fails on those, after the time-out.
        deadline = time.monotonic() + 10
        while True:
            left = [type(o).__name__ for o in gc.get_objects()
                    if isinstance(o, (ClientRequest, Flight, TrackedSender))]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        gc.enable()
    assert left == []


@pytest.mark.parametrize("newer", [False, True])
def test_one_row_is_as_before_and_response_parameters_only_where_supported(monkeypatch, cleanup, newer):
    _, pipe, _ = install(monkeypatch, newer, coalesce=False)  # the fake's two frames as two responses
    cleanup(pipe)
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


def test_n_sequences_carry_sequence_index_per_row(monkeypatch, cleanup):
    _, pipe, eng = install(monkeypatch, newer=True)
    cleanup(pipe)
    sent = run(pipe, client_request(["xy", "z"], num_return_sequences=2))
    assert by_row_and_seq(sent) == {(0, 0): "xy#0", (0, 1): "xy#1", (1, 0): "z#0", (1, 1): "z#1"}
    assert [m["n"] for m in eng.starts] == [2, 2]
    for r, _ in sent:
        if r is not None:
            assert r.output("sequence_index").dtype == np.int32 and r.output("sequence_index").shape == (1, 1)


def test_perf_metrics_and_token_counts_with_tensorrt_llm_types(monkeypatch, cleanup):
    _, pipe, _ = install(monkeypatch, newer=False)
    cleanup(pipe)
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
    ("return_context_logits", np.array([[True]])),
    ("embedding_bias_words", np.array([[b"x"]], np.object_)),
])
def test_unsupported_tensorrt_llm_features_are_invalid_arg(monkeypatch, cleanup, name, value):
    pb, pipe, eng = install(monkeypatch, newer=True)
    cleanup(pipe)
    req = pb_standin.Request({"text_input": np.array([[b"hi"]], np.object_), name: value})
    sent = run(pipe, req)
    err = sent[-1][0].error()
    assert err.code() == pb.TritonError.INVALID_ARG and name in err.message()
    assert err.message().startswith("in ensemble 'ensemble', ")
    assert eng.starts == []


def test_lora_inputs_travel_per_row_to_the_llm_instance(monkeypatch, cleanup):
    """TensorRT-LLM's lora_task_id / lora_weights / lora_config of each row reach the engine request
    as they were sent (the llm instance converts and caches them: llm/lora_tasks.py)."""
    _, pipe, eng = install(monkeypatch, newer=True)
    cleanup(pipe)
    w = np.arange(2 * 2 * 6, dtype=np.float16).reshape(2, 2, 6)
    c = np.array([[[1, 0, 2], [3, 1, 2]], [[4, 0, 1], [6, 1, 1]]], np.int32)
    req = pb_standin.Request({"text_input": np.array([[b"ab"], [b"cd"]], np.object_),
                              "lora_task_id": np.array([[5], [9]], np.uint64), "lora_weights": w, "lora_config": c})
    assert by_row_and_seq(run(pipe, req)) == {(0, None): "ab#0", (1, None): "cd#0"}
    by_prompt = {"".join(map(chr, m["prompt_ids"])): m["lora"] for m in eng.starts}
    for b, prompt in enumerate(("ab", "cd")):
        lora = by_prompt[prompt]
        assert lora["task_id"] == (5, 9)[b]
        got_w = protocol.decode_array(lora["weights"], "lora_weights")
        assert got_w.dtype == np.float16 and got_w.tobytes() == w[b:b + 1].tobytes() and got_w.shape == (1, 2, 6)
        assert protocol.decode_array(lora["config"], "lora_config").tolist() == c[b:b + 1].tolist()
    eng.starts.clear()
    run(pipe, pb_standin.Request({"text_input": np.array([[b"ab"]], np.object_),
                                  "lora_task_id": np.array([[5]], np.uint64)}))
    assert eng.starts[0]["lora"] == {"task_id": 5, "weights": None, "config": None}
    eng.starts.clear()
    run(pipe, client_request(["ab"]))
    assert eng.starts[0]["lora"] is None


def test_a_lora_task_goes_to_the_instance_that_cached_it(monkeypatch, cleanup):
    """With two llm instances, requests of a LoRA task follow the instance that served it last (its
    cache holds the task's weights); requests without a task still alternate."""
    _, pipe, first = install(monkeypatch, newer=True)
    cleanup(pipe)
    second = FakeEngine()
    other = ChannelServer("llm", "llm_0_1", second, pid=pipe.channel._pid)
    try:
        pipe.channel.instances(rescan=True)
        task = {"lora_task_id": np.array([[5]], np.uint64)}
        for _ in range(4):
            run(pipe, pb_standin.Request({"text_input": np.array([[b"ab"]], np.object_), **task}))
        before = (len(first.starts), len(second.starts))
        assert sorted(before) == [0, 4]
        for _ in range(4):
            run(pipe, client_request(["ab"]))
        assert (len(first.starts) - before[0], len(second.starts) - before[1]) == (2, 2)
    finally:
        other.close()


def test_lora_weights_without_a_task_id_are_invalid_arg(monkeypatch, cleanup):
    pb, pipe, eng = install(monkeypatch, newer=True)
    cleanup(pipe)
    req = pb_standin.Request({"text_input": np.array([[b"hi"]], np.object_),
                              "lora_weights": np.ones((1, 1, 4), np.float16),
                              "lora_config": np.array([[[1, 0, 1]]], np.int32)})
    err = run(pipe, req)[-1][0].error()
    assert err.code() == pb.TritonError.INVALID_ARG
    assert err.message() == ("in ensemble 'ensemble', lora_task_id: must be set for LoRA inference (with "
                             "lora_weights / lora_config)")
    assert eng.starts == []


def test_false_logit_flags_are_accepted(monkeypatch, cleanup):
    _, pipe, _ = install(monkeypatch, newer=True)
    cleanup(pipe)
    req = pb_standin.Request({"text_input": np.array([[b"hi"]], np.object_),
                              "return_context_logits": np.array([[False]]),
                              "return_generation_logits": np.array([[False]])})
    assert by_row_and_seq(run(pipe, req)) == {(None, None): "hi#0"}


def test_a_bad_row_fails_the_request_before_anything_is_generated(monkeypatch, cleanup):
    _, pipe, eng = install(monkeypatch, newer=True)
    cleanup(pipe)
    sent = run(pipe, client_request(["ok", ""]))
    assert len(sent) == 1 and "text_input" in sent[0][0].error().message()
    assert eng.starts == []


def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pred()


@pytest.mark.parametrize("newer", [False, True])
def test_cancellation_aborts_every_row_on_the_channel(monkeypatch, cleanup, newer):
    gate = threading.Event()
    _, pipe, eng = install(monkeypatch, newer, gate)
    cleanup(pipe)
    req = client_request(["slow", "rows"], request_id="client-1")
    pipe.submit(req)
    assert wait_for(lambda: len(req.sender.sent) >= 2)  # the first part of each row
    req.sender.cancelled = True
    assert wait_for(lambda: sorted(eng.aborted) == ["r0", "r1"])
    assert req.sender.done.wait(5)
    assert req.sender.sent[-1] == (None, 1)  # nothing more than the closing final after the cancel
    assert len(req.sender.sent) == 3
    gate.set()


def test_stop_request_stops_every_row_of_the_client_request(monkeypatch, cleanup):
    gate = threading.Event()
    _, pipe, eng = install(monkeypatch, newer=True, gate=gate)
    cleanup(pipe)
    req = client_request(["a", "b"], request_id="same-id")
    pipe.submit(req)
    assert wait_for(lambda: len(req.sender.sent) >= 2)
    stop = pb_standin.Request({"text_input": np.array([[b""]], np.object_), "stop": np.array([[True]])},
                              "same-id")
    pipe._run(stop)
    assert stop.sender.sent[-1][1] == 1 and not stop.sender.sent[-1][0].has_error()
    assert wait_for(lambda: sorted(eng.aborted) == ["r0", "r1"])
    assert req.sender.done.wait(5)
    gate.set()


def test_an_llm_instance_that_dies_mid_request_ends_it_with_unavailable(monkeypatch, cleanup):
    gate = threading.Event()
    pb, pipe, _ = install(monkeypatch, newer=True, gate=gate)
    cleanup(pipe)
    req = client_request(["abc"])
    pipe.submit(req)
    assert wait_for(lambda: len(req.sender.sent) >= 1)
    pipe._test_server.close()  # its sockets go away as when the stub process is killed
    assert req.sender.done.wait(10)
    err = req.sender.sent[-1][0].error()
    assert err.code() == pb.TritonError.UNAVAILABLE
    assert "llm instance llm_0_0 closed its engine channel" in err.message()
    assert err.message().startswith("in ensemble 'ensemble', ")
    again = client_request(["abc"])  # nothing listens any more: refused at once, named
    pipe._run(again)
    err = again.sender.sent[-1][0].error()
    assert err.code() == pb.TritonError.UNAVAILABLE and "no instance of model 'llm' is serving" in err.message()
    gate.set()


def test_client_timeout_goes_on_to_every_engine_request_of_its_rows(monkeypatch, cleanup):
    """gRPC timeout= (request.timeout()) or HTTP generate's "timeout" parameter: each row's engine
    request carries it, so the engine enforces the client's deadline; a malformed one is INVALID_ARG."""
    pb, pipe, eng = install(monkeypatch, False)
    cleanup(pipe)
    req = client_request(["ab", "c"])
    req._timeout = 2_500_000
    run(pipe, req)
    assert [m["timeout_s"] for m in eng.starts] == [2.5, 2.5]
    req = client_request(["ab"])
    req._parameters = '{"timeout": 700000}'
    run(pipe, req)
    assert eng.starts[-1]["timeout_s"] == 0.7
    req = client_request(["ab"])
    req._parameters = '{"timeout": "soon"}'
    sent = run(pipe, req)
    (err, _), = sent
    assert err.error().code() == pb.TritonError.INVALID_ARG and err.error().message().startswith(
        "in ensemble 'ensemble', timeout: ")
