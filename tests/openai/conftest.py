"""Fixtures of the OpenAI API tests (shared by test_openai_sdk.py, test_tools.py, test_disconnect.py,
test_third_party_clients.py).

`openai_server` (session scope): the server of `make serve` (the session `triton_server` of tests/conftest.py:
model_repository/ and the default model, on free loopback ports) plus the OpenAI frontend started
beside it the way `make serve` starts it (paddle_llm_launcher.frontend.start_frontend: the
same command line), on another free port; waits until its /health/ready is 200 (at most 60 s after
Triton is ready) and stops it (drain, then SIGKILL after 10 s) at the end of the session. Its output
goes to build/test-logs/openai_frontend.log (tail shown on a failed start).

`openai_client`: an `openai.OpenAI` on it (no retries, 120 s timeout, api_key "unused");
`async_openai_client` the same as `openai.AsyncOpenAI` (function scope: one event loop per test).
`openai_server.model` is the served name clients send (the model folder's name; `llm` is served too).
On Python < 3.11 (no fastapi / openai wheels: pyproject markers) the directory's tests are not collected.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import paddle_llm_launcher as launcher
from paddle_llm_launcher.frontend import OpenAIFrontend, start_frontend

# fastapi / uvicorn / openai are installed on Python >= 3.11 only (pyproject.toml markers)
if sys.version_info < (3, 11):
    collect_ignore_glob = ["test_*.py"]

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_PATH = REPO_ROOT / "build" / "test-logs" / "openai_frontend.log"
READY_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class OpenAIEndpoints:
    """base_url: "http://127.0.0.1:PORT/v1" (the SDK's base_url); base: without /v1 (health,
    metrics); model: the served model name; triton: the TritonEndpoints of the server behind it."""

    base_url: str
    base: str
    port: int
    model: str
    triton: object
    handle: OpenAIFrontend
    log_path: Path


@pytest.fixture(scope="session")
def openai_server(triton_server, smollm2_dir):
    port = launcher.free_port()
    handle = start_frontend(triton_server.grpc_port, triton_server.metrics_port, port, smollm2_dir,
                            log_path=LOG_PATH, drain_grace=5.0)
    try:
        handle.wait_ready(READY_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as e:
        handle.stop(10)
        pytest.fail(f"OpenAI frontend did not start: {e}\n{handle.log_tail(60)}", pytrace=False)
    try:
        yield OpenAIEndpoints(base_url=handle.url, base=handle.base, port=port, model=Path(smollm2_dir).name,
                              triton=triton_server, handle=handle, log_path=LOG_PATH)
    finally:
        handle.stop(10)


@pytest.fixture(scope="session")
def openai_client(openai_server):
    import openai

    client = openai.OpenAI(base_url=openai_server.base_url, api_key="unused", max_retries=0, timeout=120)
    yield client
    client.close()


@pytest.fixture
def async_openai_client(openai_server):
    import openai

    return openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="unused", max_retries=0, timeout=120)
