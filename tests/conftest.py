"""Shared fixtures. End-to-end tests take `triton_server` and carry `@pytest.mark.e2e`.

`smollm2_dir` (session scope): the converted SmolLM2-135M-Instruct folder every test directory uses,
`build/SmolLM2-135M-Instruct` (made by scripts/setup.sh) unless PADDLE_LLM_MODEL_DIR names another
converted copy; a missing folder is a failure, not a skip.

`triton_server` (session scope) starts the real tritonserver of the nvidia-pytriton wheel through
paddle_llm_launcher on free loopback ports, with the repository's `model_repository/` and that
model folder, waits until /v2/health/ready answers (at most 180 s) and stops it cleanly at the end of
the session. Server output goes to build/test-logs/tritonserver.log; its tail is shown when start-up
fails.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest

import paddle_llm_launcher as launcher
from repo_edit import copy_repository  # tests/support (pyproject's pytest pythonpath)

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPO = REPO_ROOT / "model_repository"
SMOLLM2_DIR = Path(os.environ.get("PADDLE_LLM_MODEL_DIR") or REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
LOG_PATH = REPO_ROOT / "build" / "test-logs" / "tritonserver.log"
READY_TIMEOUT_S = 180.0


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    missing = [n for n in ("config.json", "tokenizer.json", "model.safetensors") if not (SMOLLM2_DIR / n).is_file()]
    if missing:
        pytest.fail(f"converted model not found in {SMOLLM2_DIR} (no {', '.join(missing)}): run the project setup "
                    f"(scripts/setup.sh) or point PADDLE_LLM_MODEL_DIR at a converted SmolLM2-135M-Instruct folder",
                    pytrace=False)
    return str(SMOLLM2_DIR)


@dataclasses.dataclass(frozen=True)
class TritonEndpoints:
    """Addresses of the running test server.

    http_url / grpc_url are in tritonclient's form ("127.0.0.1:PORT", no scheme);
    http_base is the same HTTP endpoint with its scheme, for plain HTTP requests (generate, health);
    metrics_url is the full Prometheus URL ("http://127.0.0.1:PORT/metrics").
    """

    http_url: str
    grpc_url: str
    metrics_url: str
    http_base: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    handle: object  # paddle_llm_launcher.TritonServer


@pytest.fixture(scope="session")
def triton_server(smollm2_dir):
    http_port, grpc_port, metrics_port = launcher.free_ports(3)
    handle = launcher.start_server(MODEL_REPO, http_port, grpc_port, metrics_port,
                                   model_dir=smollm2_dir, log_path=LOG_PATH)
    failure = None
    try:
        handle.wait_ready(timeout=READY_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as e:
        failure = str(e)
    if failure is not None:
        handle.stop()
        print(f"\n----- tail of {LOG_PATH} -----\n{handle.log_tail(80)}----- end of log -----",
              file=sys.stderr)
        pytest.fail(f"tritonserver did not start: {failure}\n{_error_lines(LOG_PATH)}", pytrace=False)
    try:
        yield TritonEndpoints(
            http_url=f"127.0.0.1:{http_port}",
            grpc_url=f"127.0.0.1:{grpc_port}",
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
            http_base=f"http://127.0.0.1:{http_port}",
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
            log_path=LOG_PATH, handle=handle,
        )
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def triton_server_factory(tmp_path_factory, smollm2_dir):
    """Start extra servers on an edited copy of model_repository (tests that need another config).

    `start(edit, models=None)`: copies model_repository/ into a temporary folder, keeps only `models`
    (all when None), calls `edit(repo_path)` to change the copy (the shipped configs are never
    touched), starts tritonserver on free ports with the default model folder, waits until ready and
    returns TritonEndpoints (log_path: the server's log in that folder). Module scope: the servers a
    test module starts are stopped after its last test."""
    handles = []
    tmp_path = tmp_path_factory.mktemp("triton")

    def start(edit=None, models=None, ready_timeout: float = READY_TIMEOUT_S) -> TritonEndpoints:
        repo = copy_repository(tmp_path / f"model_repository_{len(handles)}", models, edit)
        log_path = tmp_path / f"tritonserver_{len(handles)}.log"
        http_port, grpc_port, metrics_port = launcher.free_ports(3)
        handle = launcher.start_server(repo, http_port, grpc_port, metrics_port, model_dir=smollm2_dir,
                                       log_path=log_path)
        handles.append(handle)
        try:
            handle.wait_ready(timeout=ready_timeout)
        except (RuntimeError, TimeoutError) as e:
            pytest.fail(f"tritonserver did not start: {e}\n{_error_lines(log_path)}\n{handle.log_tail(40)}",
                        pytrace=False)
        return TritonEndpoints(
            http_url=f"127.0.0.1:{http_port}", grpc_url=f"127.0.0.1:{grpc_port}",
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics", http_base=f"http://127.0.0.1:{http_port}",
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, log_path=log_path, handle=handle)

    yield start
    for h in handles:
        h.stop()


def _error_lines(path: Path, limit: int = 20) -> str:
    """Triton's error lines (E<date> ...) and its final 'error:' line from the server log."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [l for l in lines if re.match(r"^E\d{4} ", l) or l.startswith("error:")]
    errors = [l for l in errors if "CudaDriverHelper" not in l and "CUDA driver" not in l]
    return "\n".join(errors[-limit:])


# The fast tier (`make test-fast`, `-m "not slow"`): a test is slow when it talks to a real server
# (one of these fixtures, or the e2e marker), runs the soak, runs a real checkpoint or the GCU
# stand-in plug-in (tests/model, tests/gcu: seconds per test), or is marked slow by hand because it
# takes seconds on its own (a property search, a process death). `make test` runs both tiers.
SERVER_FIXTURES = frozenset({"triton_server", "triton_server_factory", "openai_server", "openai_client",
                             "async_openai_client"})
SLOW_FOLDERS = ("tests/soak/test_soak_short.py", "tests/scaleout/", "tests/model/", "tests/gcu/")


def pytest_collection_modifyitems(config, items):
    """Adds the `slow` marker to every test that needs a real server (see SERVER_FIXTURES)."""
    for item in items:
        if item.get_closest_marker("slow") is not None:
            continue
        rel = Path(str(item.fspath)).resolve().relative_to(REPO_ROOT).as_posix()
        if (item.get_closest_marker("e2e") is not None or SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
                or rel.startswith(SLOW_FOLDERS)):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """When aiperf's tests are selected, begin installing its venv now (tests/support/perf_venv.py), so
    that its 1-2 minutes of pip overlap the tests that run before them."""
    if any(item.nodeid.startswith("tests/openai/test_third_party_clients.py") and "aiperf" in item.nodeid
           for item in session.items):
        import perf_venv

        perf_venv.start()
