"""HTTP helpers for the end-to-end tests: Triton's generate extension (`generate` JSON, and
`generate_stream` Server-Sent Events) with plain `requests`, and the readiness probe."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Iterable

import requests

from clients import DEFAULT_TIMEOUT_S


@dataclasses.dataclass
class HttpResult:
    status: int
    body: dict           # parsed JSON body (generate) or {} for a stream
    events: list[dict]   # SSE events (generate_stream), in order
    error: str | None    # error message from the body / an SSE error event

    @property
    def text(self) -> str:
        if self.events:
            return "".join(e.get("text_output", "") for e in self.events if "error" not in e)
        return self.body.get("text_output", "")


def http_generate(http_base: str, model: str, payload: dict, timeout: float = DEFAULT_TIMEOUT_S) -> HttpResult:
    r = requests.post(f"{http_base}/v2/models/{model}/generate", json=payload, timeout=timeout)
    try:
        body = r.json()
    except ValueError:
        body = {"error": r.text}
    err = body.get("error") if isinstance(body, dict) else None
    return HttpResult(r.status_code, body if isinstance(body, dict) else {}, [], err)


def iter_sse(response) -> Iterable[dict]:
    """Parse `data: {...}` lines of a Server-Sent-Events response into dicts."""
    for line in response.iter_lines(decode_unicode=False):
        if not line:
            continue
        line = line.decode("utf-8")
        if line.startswith("data:"):
            data = line[5:].strip()
            if data:
                yield json.loads(data)


def http_generate_stream(http_base: str, model: str, payload: dict,
                         timeout: float = DEFAULT_TIMEOUT_S) -> HttpResult:
    deadline = time.monotonic() + timeout
    events, err = [], None
    with requests.post(f"{http_base}/v2/models/{model}/generate_stream", json=payload, stream=True,
                       timeout=timeout) as r:
        if r.status_code != 200:
            try:
                err = r.json().get("error")
            except ValueError:
                err = r.text
            return HttpResult(r.status_code, {}, [], err)
        for ev in iter_sse(r):
            events.append(ev)
            if "error" in ev:
                err = ev["error"]
            if time.monotonic() > deadline:
                raise TimeoutError(f"generate_stream not finished within {timeout} s")
        status = r.status_code
    return HttpResult(status, {}, events, err)


def server_ready(http_base: str) -> bool:
    try:
        return requests.get(f"{http_base}/v2/health/ready", timeout=5).status_code == 200
    except requests.RequestException:
        return False
