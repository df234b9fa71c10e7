"""The server of `make serve` as the soak runs it: `scripts/launch_triton.py` as a subprocess (the command
`make serve` execs), on the soak's repository copy, free loopback ports and a log file. Processes
are found from the launcher's pid down (proctree.py); only those are ever signalled. The OpenAI
frontend runs beside it, as `make serve` starts it, with VLLM_API_KEY set (openai_requests.API_KEY)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

import proctree
from openai_requests import API_KEY
from paddle_llm_launcher import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = REPO_ROOT / "scripts" / "launch_triton.py"


class SoakServer:
    """One launcher process and what it started. Ports are fresh for every start."""

    def __init__(self, model_repo: Path, model_dir: Path, log_dir: Path, generation: int = 0):
        self.model_repo, self.model_dir = Path(model_repo), Path(model_dir)
        self.http_port, self.grpc_port, self.metrics_port, self.openai_port = free_ports(4)
        self.log_path = Path(log_dir) / f"tritonserver.{generation}.log"
        self.launcher_log = Path(log_dir) / f"launcher.{generation}.log"
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_after: float | None = None
        self.known: dict[int, proctree.Proc] = {}  # every process of this server seen so far

    @property
    def grpc_url(self) -> str:
        """host:port for tritonclient.grpc."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_base(self) -> str:
        """http://host:port for plain HTTP requests."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def openai_base(self) -> str:
        """http://host:port of the OpenAI frontend (behind openai_requests.API_KEY)."""
        return f"http://127.0.0.1:{self.openai_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self) -> None:
        """Spawn the launcher (not waiting for readiness). Its own session: a Ctrl-C of the soak
        reaches the soak, which then stops the server itself."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(LAUNCHER), "--model-repo", str(self.model_repo), "--model-dir", str(self.model_dir),
               "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
               "--metrics-port", str(self.metrics_port), "--log-file", str(self.log_path),
               "--openai-port", str(self.openai_port)]
        env = dict(os.environ, VLLM_API_KEY=API_KEY)  # the OpenAI frontend behind a key, as deployed
        with open(self.launcher_log, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=out, env=env,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = time.monotonic()

    def wait_ready(self, timeout: float) -> float:
        """Poll /v2/health/ready until 200; seconds since start. Raises RuntimeError when the
        launcher exits first, TimeoutError after timeout seconds."""
        deadline = self.started_at + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"launcher exited with code {self.proc.returncode} before ready "
                                   f"(logs {self.launcher_log}, {self.log_path})")
            if self.ready("/v2/health/ready") == 200:
                self.ready_after = time.monotonic() - self.started_at
                self.processes()
                return self.ready_after
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready after {timeout:.0f} s (log {self.log_path})")
            time.sleep(0.25)

    def ready(self, path: str, timeout: float = 2.0) -> int | None:
        """HTTP status of a readiness path (None: no answer)."""
        try:
            return requests.get(f"{self.http_base}{path}", timeout=timeout).status_code
        except requests.RequestException:
            return None

    def processes(self) -> list[proctree.Proc]:
        """The live process tree (also remembered, for the final clean-up)."""
        if self.proc is None:
            return []
        procs = proctree.tree(self.proc.pid)
        for p in procs:
            self.known[p.pid] = p
        return procs

    def stub(self, instance: str) -> proctree.Proc | None:
        """The live stub process of a Triton instance (e.g. llm_0_0), None when there is none."""
        found = [p for p in self.processes() if p.role == "stub" and p.name == f"stub:{instance}"]
        return found[0] if found else None

    def tp_workers(self, instance: str) -> list[proctree.Proc]:
        """The live tensor-parallel workers under the stub of an instance, rank order."""
        return [p for p in self.processes() if p.role == "tp_worker" and p.name.startswith(f"tp_worker:{instance}:")]

    def terminate(self) -> None:
        """SIGTERM to the launcher: what `make serve` gets on Ctrl-C / SIGTERM."""
        if self.proc is not None and self.proc.poll() is None:
            self.processes()
            self.proc.terminate()

    def wait_exit(self, timeout: float) -> int | None:
        """The launcher's exit code, or None if still running after timeout seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_all(self) -> list[proctree.Proc]:
        """SIGKILL the launcher and every process of its tree seen (still the same processes); clean
        their shm regions. Returns what survived (should be nothing)."""
        procs = self.processes()
        procs += [p for p in self.known.values() if p.pid not in {q.pid for q in procs}]
        left = proctree.kill_tree([p for p in procs if proctree.alive(p.pid, p.start)])
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return left

    def stop(self, grace: float = 45.0) -> int | None:
        """SIGTERM, wait up to grace seconds, then kill whatever is left. Returns the exit code."""
        if self.proc is None:
            return None
        self.terminate()
        code = self.wait_exit(grace)
        self.kill_all()
        return code
