"""The readiness gate: how the launcher turns /v2/health/ready false at once while the models keep
serving (a drain) or while a model is reloaded, on a Triton that gives a Python model no say in it.

Measured on Triton 2.51 with explicit model control (strict readiness): the server is not ready while
any model is LOADING or UNLOADING, or failed to load; a model that was never loaded, or was unloaded
completely, does not count. So the gate is a tiny Python model in a repository of its own (beside the
user's; a plain `tritonserver --model-repository model_repository` never sees it), not loaded at
start, whose initialize() waits while its flag file exists:
- close(): create the flag, load the gate on a thread: it stays LOADING, so the server is not ready
  from the first poll on; the previous gate (READY) is unloaded meanwhile, unseen behind it;
- open(): remove the flag: the load completes, the gate is READY and the server ready again;
- shut(): once tritonserver has its SIGTERM (its readiness is false for good then), let a waiting
  initialize() return so that nothing is left loading when it exits; an initialize() that failed
  instead would be an error line in every clean shutdown's log.
Two gate models take turns (a gate must be unloaded before it can be loaded again, and unloading it
while it is the only closed one would show the server ready for a moment).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from paddle_llm_launcher.repository import RepositoryClient, RepositoryError

GATE_MODELS = ("readiness_gate_a", "readiness_gate_b")

_CONFIG = '''# The launcher's readiness gate (paddle_llm_launcher/gate.py): not an inference model.
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "unused" data_type: TYPE_BOOL dims: [ 1 ] optional: true }} ]
output [ {{ name: "unused_out" data_type: TYPE_BOOL dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''

_MODEL = '''"""The launcher's readiness gate (paddle_llm_launcher/gate.py). Not an inference model: while
its flag file exists its load does not finish, which keeps /v2/health/ready false."""

import os
import time

import triton_python_backend_utils as pb_utils

FLAGS = {flags!r}


class TritonPythonModel:
    def initialize(self, args):
        closed = os.path.join(FLAGS, args["model_name"] + ".closed")
        while os.path.exists(closed):
            if os.path.exists(os.path.join(FLAGS, "shut")):
                return  # tritonserver has its SIGTERM (not ready from then on): end the load quietly
            time.sleep(0.02)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError(
            "the readiness gate is the launcher's readiness switch, not an inference model",
            pb_utils.TritonError.UNSUPPORTED)) for _ in requests]
'''


def make_gate_repository(root: str | Path) -> Path:
    """Write the gates' model repository under `root` (created); returns the repository folder."""
    root = Path(root)
    repo = root / "gate_repository"
    flags = root / "gate_flags"
    flags.mkdir(parents=True, exist_ok=True)
    for name in GATE_MODELS:
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(_CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(_MODEL.format(flags=str(flags)))
    return repo


class ReadinessGate:
    """close() / open() / shut() (see the module doc). Thread-safe; close() and open() nest: the
    gate opens when every close() has had its open()."""

    def __init__(self, repo: RepositoryClient, root: str | Path):
        """repo: the server's repository client (TritonServer.repository(): admin headers, loads over
        gRPC, so the pending load holds no HTTP worker thread)."""
        self.repo = repo
        self.flags = Path(root) / "gate_flags"
        self._lock = threading.Lock()
        self._closes = 0
        self._turn = 0
        self._current: str | None = None  # the gate loaded (or loading) last
        self._thread: threading.Thread | None = None  # its load (a gRPC call that returns when it ends)

    def close(self) -> None:
        with self._lock:
            self._closes += 1
            if self._closes > 1:
                return
            name = GATE_MODELS[self._turn % 2]
            self._turn += 1
            previous, self._current = self._current, name
            (self.flags / f"{name}.closed").touch()
            self._thread = threading.Thread(target=self._load, args=(name,), name=f"gate-{name}", daemon=True)
            self._thread.start()
        self._wait_loading(name)
        if previous is not None:
            try:
                self.repo.unload(previous)  # hidden: the new gate keeps the server not ready
            except (RepositoryError, OSError):
                pass

    def open(self, log=print) -> bool:
        """Returns True once the gate is READY (the server ready again), False if it is still closed
        by another close() or did not finish loading within 60 s (logged)."""
        with self._lock:
            self._closes = max(0, self._closes - 1)
            if self._closes or self._current is None:
                return False
            name = self._current
            (self.flags / f"{name}.closed").unlink(missing_ok=True)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            try:
                state = self.repo.index().get(name)
            except (RepositoryError, OSError):
                state = None
            if state == "READY":
                return True
            if self._closes:
                return False  # closed again meanwhile
            time.sleep(0.02)
        log(f"launch_triton: the readiness gate {name} did not open within 60 s (state {state}); "
            f"readiness stays false")
        return False

    def finish(self, timeout: float = 5.0) -> bool:
        """After shut(): wait (at most `timeout` s) for the pending load to end, then unload that gate
        over gRPC, which Triton still serves while its HTTP endpoint waits for client connections to
        close at exit. Without this a gate loaded after the SIGTERM stayed live through that wait (a
        load balancer's keep-alive connections hold it for the whole exit timeout) and Triton exited 1.
        Returns True when the unload was sent."""
        thread, name = self._thread, self._current
        if thread is not None:
            thread.join(timeout)
        if name is None or (thread is not None and thread.is_alive()):
            return False
        try:
            self.repo.unload(name, timeout=timeout)
            return True
        except (RepositoryError, OSError):
            return False

    def shut(self) -> None:
        """Let a pending close end (call it only after tritonserver got SIGTERM: the gate's load then
        completes while the server, exiting, answers not ready)."""
        (self.flags / "shut").touch()

    def reset(self) -> None:
        """After tritonserver was restarted: no gate is loaded, none is closed."""
        with self._lock:
            self._closes = 0
            self._current = None
            for f in self.flags.glob("*.closed"):
                f.unlink(missing_ok=True)
            (self.flags / "shut").unlink(missing_ok=True)

    def _load(self, name: str) -> None:
        try:
            self.repo.load(name, timeout=24 * 3600)
        except (RepositoryError, OSError):
            pass  # the server exited or was killed meanwhile (a restart); nothing waits for it

    def _wait_loading(self, name: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.repo.index().get(name) == "LOADING":
                    return
            except (RepositoryError, OSError):
                return
            time.sleep(0.01)
