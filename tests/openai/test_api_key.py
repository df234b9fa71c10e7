"""Who may call the OpenAI frontend (paddle_llm_openai/guards.py), end to end: a second frontend
process started the way `make serve` starts it, with VLLM_API_KEY in its environment, against the
session's real tritonserver.

- /v1 routes: no key 401, a wrong key 401 (`invalid_api_key`), the right key 200 through the openai
  SDK, streamed and not; the probes (/health, /health/ready, /metrics) answer without a key;
- a body above the limit: 413 from its Content-Length alone, before the body is sent (a 50 MB
  request); a chunked body that passes the limit: 413 as soon as it does; the server keeps serving.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests

import paddle_llm_launcher as launcher
from paddle_llm_launcher.frontend import start_frontend

KEY = "sk-test-0123456789abcdef"
LIMIT = 1 << 20  # the test frontend's --max-request-body-bytes (OPENAI_MAX_REQUEST_BODY_BYTES)


@pytest.fixture(scope="module")
def keyed(triton_server, smollm2_dir, tmp_path_factory):
    port = launcher.free_port()
    log_path = tmp_path_factory.mktemp("keyed") / "frontend.log"
    handle = start_frontend(triton_server.grpc_port, triton_server.metrics_port, port, smollm2_dir,
                            log_path=log_path, drain_grace=5.0,
                            env={"VLLM_API_KEY": KEY, "OPENAI_MAX_REQUEST_BODY_BYTES": str(LIMIT)})
    try:
        handle.wait_ready(60)
    except (RuntimeError, TimeoutError) as e:
        handle.stop(10)
        pytest.fail(f"keyed frontend did not start: {e}\n{handle.log_tail(60)}", pytrace=False)
    yield handle
    handle.stop(10)
    assert KEY not in log_path.read_text(errors="replace"), "the API key was written to the log"


def _chat(base: str, headers: dict, **extra) -> requests.Response:
    body = {"model": "llm", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    return requests.post(f"{base}/v1/chat/completions", json={**body, **extra}, headers=headers, timeout=120)


@pytest.mark.parametrize("headers, code", [({}, None), ({"Authorization": f"Bearer {KEY}x"}, "invalid_api_key"),
                                           ({"Authorization": f"Basic {KEY}"}, None),
                                           ({"Authorization": "Bearer "}, None)])
def test_without_the_right_key_every_v1_route_is_401_with_openais_body(keyed, headers, code):
    for r in (_chat(keyed.base, headers), _chat(keyed.base, headers, stream=True),
              requests.get(f"{keyed.base}/v1/models", headers=headers, timeout=10),
              requests.post(f"{keyed.base}/v1/completions", json={"model": "llm", "prompt": "x"},
                            headers=headers, timeout=10)):
        assert r.status_code == 401, (r.status_code, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == code, err
        assert "API key" in err["message"] and KEY not in err["message"]
        assert r.headers.get("WWW-Authenticate") == "Bearer"


def test_the_probes_answer_without_a_key(keyed):
    assert requests.get(f"{keyed.base}/health", timeout=10).status_code == 200
    assert requests.get(f"{keyed.base}/health/ready", timeout=10).status_code == 200
    m = requests.get(f"{keyed.base}/metrics", timeout=10)
    assert m.status_code == 200 and "llm_" in m.text


def test_the_right_key_is_served_streamed_and_not_through_the_sdk(keyed):
    import openai

    wrong = openai.OpenAI(base_url=keyed.url, api_key="sk-wrong-key", max_retries=0, timeout=120)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    client = openai.OpenAI(base_url=keyed.url, api_key=KEY, max_retries=0, timeout=120)
    assert "llm" in [m.id for m in client.models.list().data]
    whole = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Say hello"}],
                                           max_tokens=8, temperature=0)
    assert whole.choices[0].message.content and whole.usage.completion_tokens > 0
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="llm", messages=[{"role": "user", "content": "Say hello"}], max_tokens=8, temperature=0, stream=True)
        if c.choices]
    assert "".join(parts) == whole.choices[0].message.content


def _raw(port: int, head: bytes, body_chunks=(), timeout: float = 10.0) -> tuple[bytes, float]:
    """Send `head`, then body chunks until the server answers; returns (the response's first bytes,
    seconds from the end of the head to the answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head)
        t0 = time.monotonic()
        s.settimeout(0.05)
        data = b""
        for chunk in body_chunks:
            try:
                data = s.recv(65536)
                if data:
                    break
            except socket.timeout:
                pass
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        s.settimeout(timeout)
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            more = s.recv(65536)
            if not more:
                break
            data += more
        return data, time.monotonic() - t0


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _error(data: bytes) -> dict:
    return json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]


def test_a_50_mb_body_is_413_before_it_is_sent_and_the_server_keeps_serving(keyed):
    size = 50 * 1024 * 1024
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n").encode()
    data, took = _raw(keyed.port, head)  # not one byte of the body is sent
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    err = _error(data)
    assert err["code"] == "request_too_large" and str(LIMIT) in err["message"], err
    # without the key the same request is refused for the key first
    data, _ = _raw(keyed.port, head.replace(f"Authorization: Bearer {KEY}\r\n".encode(), b""))
    assert data.startswith(b"HTTP/1.1 401"), data[:200]
    # chunked (no Content-Length): refused once the body passes the limit, not after all of it
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    piece = b"x" * 65536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    data, _ = _raw(keyed.port, head, [chunk] * (size // len(piece)))
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    r = _chat(keyed.base, {"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
    print(f"\n[api key] 50 MB Content-Length refused with 413 {took * 1000:.0f} ms after the request head")


def test_a_body_under_the_limit_is_served(keyed):
    filler = "word " * ((LIMIT - 4096) // 5)  # just under the limit: read and parsed, then llm's own check
    r = _chat(keyed.base, {"Authorization": f"Bearer {KEY}"}, user=filler)
    assert r.status_code == 200, r.text
