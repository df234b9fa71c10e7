"""Client cancellation frees the engine's work, on both entry points, seen on the metrics endpoint
(llm_kv_cache_used_blocks back to 0, llm_num_requests_running back to 0, an "abort" counted):

- `llm` directly: gRPC stop_stream(cancel_requests=True), an HTTP generate_stream whose client drops
  the connection, and TensorRT-LLM's `stop` input with the same request id;
- `ensemble` (a BLS model that sees its own cancellation and stops its llm request, since Triton 2.51
  does not pass cancellation into the steps of a Triton ensemble): the same three, plus a gRPC client
  process killed mid-stream.
Each test prints the time from the cancel to the blocks being free (docs/operations/cancellation.md)."""

from __future__ import annotations

import http.client
import json
import queue
import time
from urllib.parse import urlparse

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from clients import GrpcStream, ensemble_inputs, ensemble_stream, is_final, llm_inputs, llm_stream, sampling_json
from http_clients import server_ready
from metrics_util import is_idle, llm_value, wait_for

pytestmark = pytest.mark.e2e

LONG = {"temperature": "0", "max_tokens": "200", "ignore_eos": "true"}
# TensorRT-LLM names have no ignore_eos: min_tokens = max_tokens keeps EOS masked to the end
ENSEMBLE_LONG = dict(max_tokens=200, min_tokens=200, temperature=0.0, stream=True)
PROMPT = "Once upon a time"
FREE_WITHIN_S = 3.0  # 200 tokens take ~5-10 s here: an uncancelled request would not be done by then


def _report(capsys, what, seconds):
    with capsys.disabled():
        print(f"\n[cancel] {what}: KV blocks freed {seconds * 1000:.0f} ms after the client cancelled")


def _counters(m):
    return (llm_value(m, "llm_generation_tokens_total"),
            llm_value(m, "llm_requests_total", finish_reason="abort"))


def _wait_running(murl):
    wait_for(murl, lambda m: llm_value(m, "llm_kv_cache_used_blocks") >= 1
             and llm_value(m, "llm_num_requests_running") == 1, timeout=5)


def _assert_freed(murl, t_cancel, before, capsys, what):
    m, _ = wait_for(murl, is_idle, timeout=FREE_WITHIN_S + 10)
    freed_after = time.monotonic() - t_cancel
    _report(capsys, what, freed_after)
    gen0, abort0 = before
    gen1, _ = _counters(m)
    assert freed_after <= FREE_WITHIN_S, f"blocks freed only {freed_after:.2f} s after the cancel"
    assert gen1 - gen0 < 150, f"{gen1 - gen0} tokens generated: the request was not aborted"
    wait_for(murl, lambda mm: _counters(mm)[1] >= abort0 + 1, timeout=5)
    return freed_after


def _idle_counters(murl):
    m, _ = wait_for(murl, is_idle, timeout=30)
    return _counters(m)


def _read_events(resp, n):
    events = 0
    while events < n:
        line = resp.fp.readline()
        assert line, "stream ended early"
        if line.startswith(b"data:"):
            assert b'"error"' not in line, line
            events += 1


def _open_sse(http_base, model, payload):
    u = urlparse(http_base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", f"/v2/models/{model}/generate_stream", body=json.dumps(payload),
                 headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    return conn, resp


# -- llm --------------------------------------------------------------------------------------------

def test_grpc_cancel_frees_kv_blocks(triton_server, capsys):
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    before = _idle_counters(murl)
    s = GrpcStream(url, "llm", llm_inputs(PROMPT, True, LONG))
    try:
        for _ in range(2):
            result, err = s.next(timeout=60)
            assert err is None, err
        _wait_running(murl)
    finally:
        t_cancel = time.monotonic()
        s.cancel()
    _assert_freed(murl, t_cancel, before, capsys, "llm, gRPC stop_stream(cancel_requests=True)")
    # the server keeps serving
    r = llm_stream(url, "The capital of France is", stream=True,
                   sampling_parameters={"temperature": "0", "max_tokens": "8"}).raise_for_error()
    assert "Paris" in r.text


def test_http_generate_stream_dropped_connection_frees_kv_blocks(triton_server, capsys):
    murl = triton_server.metrics_url
    before = _idle_counters(murl)
    conn, resp = _open_sse(triton_server.http_base, "llm",
                           {"text_input": PROMPT, "stream": True, "sampling_parameters": sampling_json(LONG)})
    try:
        _read_events(resp, 2)
        _wait_running(murl)
    finally:
        t_cancel = time.monotonic()
        resp.close()
        conn.close()
    _assert_freed(murl, t_cancel, before, capsys, "llm, HTTP generate_stream connection closed")
    assert server_ready(triton_server.http_base)


def _stop_tensor(shape):
    t = grpcclient.InferInput("stop", shape, "BOOL")
    t.set_data_from_numpy(np.ones(shape, dtype=np.bool_))
    return t


def _run_with_stop(url, model, inputs, stop_inputs, murl, capsys, what):
    """Start a long request under request id R on one stream, then send a stop request with id R on
    the same stream (TensorRT-LLM clients' --stop-after-ms): both requests end, blocks are freed."""
    before = _idle_counters(murl)
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    rid = f"stop-test-{time.monotonic_ns()}"
    try:
        client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)
        for _ in range(2):
            result, err = q.get(timeout=60)
            assert err is None, err
        _wait_running(murl)
        t_stop = time.monotonic()
        client.async_stream_infer(model, stop_inputs, request_id=rid, enable_empty_final_response=True)
        finals, texts = 0, []
        while finals < 2:  # the stop request's own answer and the stopped request's last response
            result, err = q.get(timeout=30)
            assert err is None, err
            assert result.get_response().id == rid
            if is_final(result):
                finals += 1
        _assert_freed(murl, t_stop, before, capsys, what)
    finally:
        client.stop_stream()
        client.close()


def test_llm_stop_input_with_the_same_request_id(triton_server, capsys):
    _run_with_stop(triton_server.grpc_url, "llm", llm_inputs(PROMPT, True, LONG, return_finish_reason=True),
                   [_stop_tensor([1])], triton_server.metrics_url, capsys, "llm, stop input with the same request id")


def test_llm_stop_without_request_id_is_invalid_arg(triton_server):
    r = GrpcStream(triton_server.grpc_url, "llm", [_stop_tensor([1])]).collect()
    assert r.error is not None and "stop" in str(r.error) and "request id" in str(r.error)


# -- ensemble ---------------------------------------------------------------------------------------

def test_ensemble_grpc_cancel_frees_kv_blocks(triton_server, capsys):
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    before = _idle_counters(murl)
    s = GrpcStream(url, "ensemble", ensemble_inputs(PROMPT, **ENSEMBLE_LONG))
    try:
        for _ in range(2):
            result, err = s.next(timeout=60)
            assert err is None, err
        _wait_running(murl)
    finally:
        t_cancel = time.monotonic()
        s.cancel()
    _assert_freed(murl, t_cancel, before, capsys, "ensemble, gRPC stop_stream(cancel_requests=True)")
    r = ensemble_stream(url, "The capital of France is", max_tokens=8, temperature=0.0, stream=True).raise_for_error()
    assert "Paris" in r.text


_CLIENT_SCRIPT = """
import sys, time
sys.path.insert(0, sys.argv[2])  # tests/support: a `python -c` child does not get pytest's pythonpath
from clients import GrpcStream, ensemble_inputs
s = GrpcStream(sys.argv[1], "ensemble", ensemble_inputs("Once upon a time", max_tokens=200, min_tokens=200,
                                                         temperature=0.0, stream=True))
for _ in range(2):
    r, e = s.next(timeout=60)
    assert e is None, e
print("streaming", flush=True)
time.sleep(600)
"""


def test_ensemble_grpc_client_killed_frees_kv_blocks(triton_server, capsys):
    """The client process dies mid-stream (SIGKILL: no cancel, its connection just goes away)."""
    import subprocess
    import sys
    from pathlib import Path

    url, murl = triton_server.grpc_url, triton_server.metrics_url
    before = _idle_counters(murl)
    support = Path(__file__).resolve().parents[1] / "support"
    proc = subprocess.Popen([sys.executable, "-c", _CLIENT_SCRIPT, url, str(support)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "streaming"
        _wait_running(murl)
    finally:
        t_cancel = time.monotonic()
        proc.kill()
        proc.wait()
    _assert_freed(murl, t_cancel, before, capsys, "ensemble, gRPC client process killed")


def test_ensemble_http_generate_stream_dropped_connection_frees_kv_blocks(triton_server, capsys):
    murl = triton_server.metrics_url
    before = _idle_counters(murl)
    payload = {"text_input": PROMPT, **{k: v for k, v in ENSEMBLE_LONG.items()}}
    conn, resp = _open_sse(triton_server.http_base, "ensemble", payload)
    try:
        _read_events(resp, 2)
        _wait_running(murl)
    finally:
        t_cancel = time.monotonic()
        resp.close()
        conn.close()
    _assert_freed(murl, t_cancel, before, capsys, "ensemble, HTTP generate_stream connection closed")
    assert server_ready(triton_server.http_base)


def test_ensemble_stop_input_with_the_same_request_id(triton_server, capsys):
    stop_inputs = ensemble_inputs("") + [_stop_tensor([1, 1])]
    _run_with_stop(triton_server.grpc_url, "ensemble", ensemble_inputs(PROMPT, **ENSEMBLE_LONG), stop_inputs,
                   triton_server.metrics_url, capsys, "ensemble, stop input with the same request id")


def test_ensemble_cancel_of_one_stream_leaves_the_others_running(triton_server):
    """Three streams, the middle one cancelled: the other two finish with their full text."""
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    _idle_counters(murl)
    params = dict(max_tokens=24, min_tokens=24, temperature=0.0, stream=True)
    solo = ensemble_stream(url, PROMPT, **params).raise_for_error().text
    streams = [GrpcStream(url, "ensemble", ensemble_inputs(PROMPT, **(ENSEMBLE_LONG if i == 1 else params)))
               for i in range(3)]
    result, err = streams[1].next(timeout=60)
    assert err is None, err
    streams[1].cancel()
    texts = [streams[i].collect().raise_for_error().text for i in (0, 2)]
    assert texts == [solo, solo]
    wait_for(murl, is_idle, timeout=FREE_WITHIN_S + 10)
