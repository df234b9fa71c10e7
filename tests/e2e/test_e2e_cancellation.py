"""Client cancellation on `llm`: gRPC stop_stream(cancel_requests=True) and an HTTP generate_stream
whose client drops the connection abort the request and free its KV blocks, seen on the metrics
endpoint (llm_kv_cache_used_blocks back to 0, llm_num_requests_running back to 0).

(Cancellation is not passed into the steps of an ensemble by Triton 2.51, so `llm` is called
directly here.)"""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlparse

import pytest

from clients import GrpcStream, llm_inputs, llm_stream, sampling_json, server_ready
from metrics_util import is_idle, llm_value, wait_for

pytestmark = pytest.mark.e2e

LONG = {"temperature": "0", "max_tokens": "200", "ignore_eos": "true"}
PROMPT = "Once upon a time"
FREE_WITHIN_S = 3.0  # 200 tokens take ~5-10 s here: an uncancelled request would not be done by then


def _report(capsys, what, seconds):
    with capsys.disabled():
        print(f"\n[cancel] {what}: KV blocks freed {seconds * 1000:.0f} ms after the client cancelled")


def _counters(m):
    return (llm_value(m, "llm_generation_tokens_total"),
            llm_value(m, "llm_requests_total", finish_reason="abort"))


def test_grpc_cancel_frees_kv_blocks(triton_server, capsys):
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    idle_m, _ = wait_for(murl, is_idle, timeout=30)
    gen0, abort0 = _counters(idle_m)

    s = GrpcStream(url, "llm", llm_inputs(PROMPT, True, LONG))
    try:
        for _ in range(2):
            result, err = s.next(timeout=60)
            assert err is None, err
        # the request is running and holds blocks
        wait_for(murl, lambda m: llm_value(m, "llm_kv_cache_used_blocks") >= 1
                 and llm_value(m, "llm_num_requests_running") == 1, timeout=5)
    finally:
        t_cancel = time.monotonic()
        s.cancel()
    m, _ = wait_for(murl, is_idle, timeout=FREE_WITHIN_S + 10)
    freed_after = time.monotonic() - t_cancel
    _report(capsys, "gRPC stop_stream(cancel_requests=True)", freed_after)
    gen1, abort1 = _counters(m)
    assert freed_after <= FREE_WITHIN_S, f"blocks freed only {freed_after:.2f} s after cancel"
    assert gen1 - gen0 < 150, f"{gen1 - gen0} tokens generated: the request was not aborted"
    wait_for(murl, lambda mm: _counters(mm)[1] >= abort0 + 1, timeout=5)
    # the server keeps serving
    r = llm_stream(url, "The capital of France is", stream=True,
                   sampling_parameters={"temperature": "0", "max_tokens": "8"}).raise_for_error()
    assert "Paris" in r.text


def test_http_generate_stream_dropped_connection_frees_kv_blocks(triton_server, capsys):
    murl = triton_server.metrics_url
    idle_m, _ = wait_for(murl, is_idle, timeout=30)
    gen0, abort0 = _counters(idle_m)

    u = urlparse(triton_server.http_base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    body = json.dumps({"text_input": PROMPT, "stream": True, "sampling_parameters": sampling_json(LONG)})
    conn.request("POST", "/v2/models/llm/generate_stream", body=body,
                 headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    resp = conn.getresponse()
    try:
        assert resp.status == 200, resp.read()
        events = 0
        while events < 2:
            line = resp.fp.readline()
            assert line, "stream ended early"
            if line.startswith(b"data:"):
                assert b'"error"' not in line, line
                events += 1
        wait_for(murl, lambda m: llm_value(m, "llm_kv_cache_used_blocks") >= 1
                 and llm_value(m, "llm_num_requests_running") == 1, timeout=5)
    finally:
        t_cancel = time.monotonic()
        resp.close()
        conn.close()
    m, _ = wait_for(murl, is_idle, timeout=FREE_WITHIN_S + 10)
    freed_after = time.monotonic() - t_cancel
    _report(capsys, "HTTP generate_stream connection closed", freed_after)
    gen1, abort1 = _counters(m)
    assert freed_after <= FREE_WITHIN_S, f"blocks freed only {freed_after:.2f} s after the client disconnected"
    assert gen1 - gen0 < 150, f"{gen1 - gen0} tokens generated: the request was not aborted"
    wait_for(murl, lambda mm: _counters(mm)[1] >= abort0 + 1, timeout=5)
    assert server_ready(triton_server.http_base)
