"""A client that goes away from the OpenAI endpoint gets its request cancelled (issue 18,
docs/openai/index.md): the frontend cancels the gRPC stream to `llm`, the engine aborts the request, and
`llm_kv_cache_used_blocks` on Triton's metrics endpoint is back at its idle value within FREE_WITHIN_S
(1 s) of the socket closing; then the server keeps serving.

Cases: /v1/chat/completions and /v1/completions, streamed (the client read two SSE events, then
closed) and not streamed (nothing sent back yet: the frontend sees the close through uvicorn's
`http.disconnect`, which Triton 2.51's own HTTP endpoint never reports; docs/operations/cancellation.md).
Each request asks for LONG_TOKENS tokens with EOS ignored, which takes many seconds here, so a
request that was not cancelled cannot be done within the bound; the test also checks that it was
counted as aborted (`llm_requests_total{finish_reason="abort"}`) and generated far fewer tokens.
The metrics endpoint is polled every 10 ms; each case prints the measured time.

Time: about 3-6 s per case here, 20-30 s for the file (the server and frontend fixtures aside).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests

from clients import scrape_metrics
from metrics_util import llm_value, wait_for

pytestmark = pytest.mark.e2e

FREE_WITHIN_S = 1.0
QUEUE_LEAVE_S = 5.0
# the session server's running slots: max_num_seqs of the shipped llm config
SLOTS = int(re.search(r'key: "max_num_seqs" value: \{ string_value: "(\d+)"',
                      (Path(__file__).resolve().parents[2] / "model_repository" / "llm" / "config.pbtxt").read_text()).group(1))
LONG_TOKENS = 400
POLL_S = 0.01


def _state(m) -> tuple[float, float, float]:
    return (llm_value(m, "llm_kv_cache_used_blocks"), llm_value(m, "llm_num_requests_running"),
            llm_value(m, "llm_num_requests_waiting"))


def _counters(m) -> tuple[float, float]:
    return (llm_value(m, "llm_generation_tokens_total"), llm_value(m, "llm_requests_total", finish_reason="abort"))


def _idle(metrics_url: str):
    """Wait until nothing runs or waits and the KV gauge holds still; (idle used blocks, counters)."""
    m, _ = wait_for(metrics_url, lambda mm: _state(mm)[1:] == (0, 0), timeout=60)
    return _state(m)[0], _counters(m)


def _body(endpoint: str, stream: bool) -> dict:
    common = {"model": "llm", "max_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True, "stream": stream}
    if endpoint == "chat":
        return {**common, "messages": [{"role": "user", "content": "Tell me a very long story about a dragon."}]}
    return {**common, "prompt": "Once upon a time"}


def _open(base: str, endpoint: str, stream: bool) -> http.client.HTTPConnection:
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    conn.request("POST", path, body=json.dumps(_body(endpoint, stream)), headers={"Content-Type": "application/json"})
    return conn


def _read_sse_events(conn: http.client.HTTPConnection, n: int) -> list[dict]:
    resp = conn.getresponse()
    assert resp.status == 200, (resp.status, resp.read(500))
    events = []
    while len(events) < n:
        line = resp.fp.readline()
        assert line, "stream ended early"
        if line.startswith(b"data:"):
            events.append(json.loads(line[5:]))
    return events


def _close_hard(conn: http.client.HTTPConnection) -> float:
    """Shut the socket both ways and close it (what a killed client or a closed browser tab does);
    returns the monotonic time of the close."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.sock.close()
    conn.close()
    return time.monotonic()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not_streamed"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_disconnect_cancels_and_frees_kv_within_1s(openai_server, endpoint, stream, capsys):
    base, murl = openai_server.base, openai_server.triton.metrics_url
    idle_blocks, (gen0, abort0) = _idle(murl)

    conn = _open(base, endpoint, stream)
    if stream:
        first = _read_sse_events(conn, 2)
        assert first[0]["object"] == ("chat.completion.chunk" if endpoint == "chat" else "text_completion")
    # the request is in the engine and holds KV blocks
    wait_for(murl, lambda m: _state(m)[0] > idle_blocks and _state(m)[1] == 1, timeout=30)
    t_close = _close_hard(conn)

    freed_after = None
    while time.monotonic() - t_close < FREE_WITHIN_S + 10:
        m = scrape_metrics(murl)
        if _state(m) == (idle_blocks, 0, 0):
            freed_after = time.monotonic() - t_close
            break
        time.sleep(POLL_S)
    with capsys.disabled():
        print(f"\n[disconnect] {endpoint} {'streamed' if stream else 'not streamed'}: KV back to {idle_blocks:.0f} "
              f"used blocks {'%.0f ms' % (freed_after * 1000) if freed_after is not None else 'NOT within 11 s'} "
              f"after the client closed")
    assert freed_after is not None, f"KV still in use 11 s after the disconnect: {_state(m)}"
    assert freed_after <= FREE_WITHIN_S, f"KV back only {freed_after:.2f} s after the disconnect"
    m, _ = wait_for(murl, lambda mm: _counters(mm)[1] >= abort0 + 1, timeout=5)
    generated = _counters(m)[0] - gen0
    assert generated < LONG_TOKENS / 2, f"{generated} tokens generated: the request was not cancelled"


def test_server_keeps_serving_after_disconnects(openai_server):
    base = openai_server.base
    for endpoint in ("chat", "completions"):  # one more disconnect of each kind right before
        conn = _open(base, endpoint, stream=False)
        time.sleep(0.2)
        _close_hard(conn)
    assert requests.get(f"{base}/health/ready", timeout=10).status_code == 200
    r = requests.post(f"{base}/v1/chat/completions", timeout=120, json={
        "model": "llm", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["finish_reason"] == "length", body
    r = requests.post(f"{base}/v1/completions", timeout=120, json={
        "model": "llm", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "prompt": "The capital of France is"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    _idle(openai_server.triton.metrics_url)


def test_a_stream_whose_client_leaves_while_queued_is_cancelled_in_the_queue(openai_server, capsys):
    """Every running slot busy (max_num_seqs streams), then one more streamed request: it waits in the
    engine's queue, its client leaves before any token, and it leaves the queue (counted aborted)
    within QUEUE_LEAVE_S, while the slots are still busy (for minutes: 1500 tokens each). Before the fix
    a stream was watched only from its first token, so it kept its place (and counted toward
    max_num_waiting) until scheduled. The bound is looser than FREE_WITHIN_S: 32 streams decoding
    slow the engine's cancellation sweep on 2 cores (1.4 s measured once)."""
    base, murl = openai_server.base, openai_server.triton.metrics_url
    _, (_, abort0) = _idle(murl)
    slots = SLOTS
    body = {"model": "llm", "max_tokens": 1500, "temperature": 0, "ignore_eos": True, "stream": True,
            "prompt": "Once upon a time"}
    u = urlparse(base)

    def post(payload):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps(payload), headers={"Content-Type": "application/json"})
        return c

    busy = [post(body) for _ in range(slots)]
    try:
        wait_for(murl, lambda m: _state(m)[1] == slots, timeout=60)
        queued = post(dict(body, prompt="A request that waits"))
        wait_for(murl, lambda m: _state(m)[2] == 1, timeout=30)
        t_close = _close_hard(queued)
        left_after = None
        while time.monotonic() - t_close < QUEUE_LEAVE_S + 10:
            m = scrape_metrics(murl)
            if _state(m)[2] == 0:
                left_after = time.monotonic() - t_close
                break
            time.sleep(POLL_S)
        still_running = _state(m)[1]
        aborts = _counters(m)[1] - abort0
    finally:
        for c in busy:
            _close_hard(c)
    with capsys.disabled():
        print(f"\n[disconnect] queued stream: left the queue "
              f"{'%.0f ms' % (left_after * 1000) if left_after is not None else 'NOT within 11 s'} after its "
              f"client closed, {still_running:.0f} streams still running")
    assert left_after is not None and left_after <= QUEUE_LEAVE_S, left_after
    assert still_running == slots, "the slots freed up: the request may have been scheduled, not cancelled"
    assert aborts >= 1
    _idle(murl)
