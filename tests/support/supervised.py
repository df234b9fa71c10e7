"""The server of `make serve` (scripts/launch_triton.py, supervised) as a subprocess of a test:
started on a repository copy and free loopback ports, its output in a log file, stopped by signal.
Also: the stub processes of the running tritonserver by model / instance, and bounded waits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

import paddle_llm_launcher as launcher
from paddle_llm_launcher import procs
from paddle_llm_launcher.supervisor import stub_identity

REPO_ROOT = Path(__file__).resolve().parents[2]


class SupervisedServer:
    """scripts/launch_triton.py running `repo` (see the module doc). Ports: http / grpc / metrics."""

    def __init__(self, repo: Path, model_dir: str, log_path: Path, drain_grace: float = 30.0, extra=(),
                 env: dict | None = None):
        """env: variables set for the launcher on top of this process's (e.g. TRITON_ADMIN_KEY)."""
        self.http_port, self.grpc_port, self.metrics_port = launcher.free_ports(3)
        self.http_base = f"http://127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.log_path = Path(log_path)
        self.server_log = self.log_path.with_suffix(".triton.log")
        self._out = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "scripts" / "launch_triton.py"), "--model-repo", str(repo),
             "--model-dir", model_dir, "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
             "--metrics-port", str(self.metrics_port), "--log-file", str(self.server_log),
             "--drain-grace", str(drain_grace), *extra],
            stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
            env={**os.environ, **(env or {})},
            preexec_fn=procs.set_parent_death_signal)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        """HTTP ready and the metrics endpoint answering: Triton starts its metrics service after the
        HTTP one (tens of ms on an idle host, longer under load), so a test that scrapes right after
        HTTP readiness could find the port closed."""
        try:
            if requests.get(f"{self.http_base}/v2/health/ready", timeout=2).status_code != 200:
                return False
            return requests.get(self.metrics_url, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def wait(self, pred, timeout: float, what: str, poll: float = 0.1) -> float:
        """Poll pred() until true; returns the seconds it took. AssertionError after `timeout`."""
        t0 = time.monotonic()
        while not pred():
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited ({self.proc.returncode}) while waiting for {what}:\n"
                                     f"{self.output()[-3000:]}")
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"not {what} within {timeout:.0f} s:\n{self.output()[-3000:]}")
            time.sleep(poll)
        return time.monotonic() - t0

    def server_pid(self) -> int | None:
        kids = procs.children(self.proc.pid)
        for pid in kids:
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"tritonserver"):
                    return pid
            except OSError:
                continue
        return None

    def stubs(self) -> dict[tuple[str, str], int]:
        """{(model, instance): pid} of the stub processes of the current tritonserver."""
        pid = self.server_pid()
        if pid is None:
            return {}
        out = {}
        for child in procs.children(pid):
            ident = stub_identity(child)
            if ident is not None:
                out[ident] = child
        return out

    def signal(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()
        return self.proc.returncode
