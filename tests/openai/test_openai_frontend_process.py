"""The frontend as a process (launcher/frontend.py, what `make serve` runs): drain on SIGTERM, restart
after a crash, and 503 rather than a hang when Triton cannot be reached. Extra frontends against the
session's Triton (a start is about 3 s: the tokenizer load), so the module takes about 20 s."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import openai
import pytest

from paddle_llm_triton import launcher
from paddle_llm_triton.launcher.frontend import start_frontend

pytestmark = pytest.mark.e2e


@pytest.fixture
def frontend(triton_server, smollm2_dir, tmp_path):
    handles = []

    def start(grpc_port=None, drain_grace=10.0):
        h = start_frontend(grpc_port or triton_server.grpc_port, triton_server.metrics_port, launcher.free_port(),
                           smollm2_dir, log_path=tmp_path / f"frontend_{len(handles)}.log", drain_grace=drain_grace,
                           log=lambda line: None)
        handles.append(h)
        return h

    yield start
    for h in handles:
        h.stop(10)


def test_sigterm_drains(frontend):
    h = frontend()
    h.wait_ready(60)
    client = openai.OpenAI(base_url=h.url, api_key="unused", max_retries=0, timeout=60)
    got = {}

    def stream():
        chunks = list(client.completions.create(model="llm", prompt="Count:", max_tokens=24, temperature=0,
                                                extra_body={"ignore_eos": True}, stream=True,
                                                stream_options={"include_usage": True}))
        got["usage"] = chunks[-1].usage

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.monotonic() + 30
    while httpx.get(f"{h.base}/metrics").text.count("openai_requests_in_flight 1.0") == 0:
        assert time.monotonic() < deadline, "the stream never started"
        time.sleep(0.05)
    h.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert httpx.get(f"{h.base}/health/ready").status_code == 503
    with pytest.raises(openai.APIStatusError) as ei:
        client.completions.create(model="llm", prompt="x", max_tokens=1)
    assert ei.value.status_code == 503
    t.join(60)
    assert got["usage"].completion_tokens == 24  # the stream in flight finished
    assert h.proc.wait(15) == 0


def test_restarted_after_a_crash(frontend):
    h = frontend()
    h.wait_ready(60)
    h.proc.kill()
    h.proc.wait(5)
    deadline = time.monotonic() + 5
    while not h.poll_restart():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    h.wait_ready(60)
    assert h.restarts == 1
    client = openai.OpenAI(base_url=h.url, api_key="unused", max_retries=0, timeout=60)
    assert client.completions.create(model="llm", prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_triton_unreachable_is_503_not_a_hang(frontend):
    h = frontend(grpc_port=launcher.free_port())  # nothing listens there
    deadline = time.monotonic() + 60
    while not _up(h):
        assert time.monotonic() < deadline and h.running(), h.log_tail()
        time.sleep(0.2)
    assert httpx.get(f"{h.base}/health").status_code == 503
    assert httpx.get(f"{h.base}/health/ready").status_code == 503
    client = openai.OpenAI(base_url=h.url, api_key="unused", max_retries=0, timeout=30)
    for stream in (False, True):
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as ei:
            r = client.completions.create(model="llm", prompt="Hi", max_tokens=2, stream=stream)
            list(r) if stream else None
        assert ei.value.status_code == 503 and time.monotonic() - t0 < 10


def _up(h) -> bool:
    try:
        httpx.get(f"{h.base}/health", timeout=2)
        return True
    except httpx.HTTPError:
        return False
