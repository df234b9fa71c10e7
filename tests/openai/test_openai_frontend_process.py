"""The frontend as a process (paddle_llm_launcher/frontend.py, what `make serve` runs): drain on SIGTERM, restart
after a crash, and 503 rather than a hang when Triton cannot be reached (extra frontends against the
session's Triton; a start is about 3 s: the tokenizer load); and `scripts/serve.sh` itself (what
`make serve` runs after set-up) on free ports: its ready line names the OpenAI URL next to Triton's,
a chat answer comes through, SIGTERM stops both with exit 0 (its own tritonserver: 15 s here)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

import paddle_llm_launcher as launcher
from paddle_llm_launcher import procs
from paddle_llm_launcher.frontend import start_frontend

REPO_ROOT = Path(__file__).resolve().parents[2]

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


def test_make_serve_prints_and_serves_the_openai_url(smollm2_dir, tmp_path):
    http, grpc, metrics, oai = launcher.free_ports(4)
    env = dict(os.environ, HTTP_PORT=str(http), GRPC_PORT=str(grpc), METRICS_PORT=str(metrics), OPENAI_PORT=str(oai),
               MODEL_DIR=smollm2_dir, DRAIN_GRACE_S="10")
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", str(REPO_ROOT / "scripts" / "serve.sh")],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=procs.set_parent_death_signal)
    try:
        deadline = time.monotonic() + 240
        url = f"http://127.0.0.1:{oai}/v1"
        while not re.search(rf"ready in [0-9.]+ s: http 127.0.0.1:{http}, grpc 127.0.0.1:{grpc}, metrics "
                            rf"127.0.0.1:{metrics}, openai {re.escape(url)}", log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        while not _ready(oai):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(model=Path(smollm2_dir).name, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "Hi"}])
        assert r.usage.completion_tokens >= 1 and r.choices[0].message.content
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    text = log.read_text()
    assert code == 0 and "OpenAI frontend exited with code 0" in text, text[-3000:]


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
