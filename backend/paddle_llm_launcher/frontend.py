"""The OpenAI API frontend process (`python -m paddle_llm_openai`) beside tritonserver.

`start_frontend(grpc_port, metrics_port, openai_port, model_dir, ...)` starts it (not waiting) and
returns an `OpenAIFrontend` handle: `wait_ready()` polls its /health/ready (200 once Triton's `llm`
is ready), `poll_restart()` brings it back if it died (the launcher's loop calls it: supervised like
the models), `stop(grace)` drains it (SIGTERM: ready false, new requests 503, requests in flight
finish) and waits, then SIGKILLs it if it is still there. Same host rule as tritonserver: loopback
unless BIND_ADDRESS says otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from paddle_llm_launcher import procs
from paddle_llm_launcher.admin_api import LORA_KEY_ENV, lora_admin_key


def frontend_command(grpc_port: int, metrics_port: int, openai_port: int, model_dir, host: str | None = None,
                     served_model_names=None, drain_grace: float = 30.0, python=None, model: str = "llm") -> list[str]:
    host = host or os.environ.get("BIND_ADDRESS", "127.0.0.1")
    cmd = [str(python or sys.executable), "-m", "paddle_llm_openai",
           "--tritonserver-url", f"127.0.0.1:{grpc_port}",
           "--triton-metrics-url", f"http://127.0.0.1:{metrics_port}/metrics",
           "--model", model, "--tokenizer", str(Path(model_dir).resolve()),
           "--host", host, "--openai-port", str(openai_port), "--drain-grace", str(drain_grace)]
    if served_model_names:
        cmd += ["--served-model-name", *served_model_names]
    return cmd


class OpenAIFrontend:
    """A running frontend process. url: "http://host:port/v1" (what OpenAI clients take as base_url)."""

    def __init__(self, cmd: list[str], port: int, log_path: Path | None, log=print, env: dict | None = None):
        self.cmd, self.port, self.log_path, self.log = cmd, port, log_path, log
        self.extra_env = dict(env or {})
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/v1"
        self.restarts = 0
        self._stopping = False
        self._last_start = 0.0
        self.proc = self._spawn("wb")

    def _spawn(self, mode: str) -> subprocess.Popen:
        out = open(self.log_path, mode) if self.log_path is not None else None
        self._last_start = time.monotonic()
        try:
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            env[LORA_KEY_ENV] = lora_admin_key(env)  # the same as its server's (admin_api.py)
            env.update(self.extra_env)
            return subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT if out else None, env=env,
                                    preexec_fn=procs.set_parent_death_signal, close_fds=True)
        finally:
            if out is not None:
                out.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 60.0, poll: float = 0.1) -> float:
        """Seconds until /health/ready answered 200; RuntimeError if the process exits, TimeoutError."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if not self.running():
                raise RuntimeError(f"the OpenAI frontend exited with code {self.proc.returncode}{self._hint()}")
            if self.is_ready():
                return time.monotonic() - t0
            time.sleep(poll)
        raise TimeoutError(f"the OpenAI frontend was not ready after {timeout:.0f} s{self._hint()}")

    def poll_restart(self) -> bool:
        """Restart the process if it died (not while stopping; 1 s after its start, doubling with each
        restart up to 60 s, so a port in use does not spin). True if restarted."""
        if self._stopping or self.running() or time.monotonic() - self._last_start < min(60.0, 2.0 ** self.restarts):
            return False
        code = self.proc.returncode
        self.restarts += 1
        self.log(f"launch_triton: the OpenAI frontend (pid {self.proc.pid}) exited with code {code}: restarting it "
                 f"(restart {self.restarts})")
        self.proc = self._spawn("ab")
        return True

    def terminate(self) -> None:
        """Begin the drain (SIGTERM); see stop()."""
        self._stopping = True
        if self.running():
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 35.0) -> int:
        """Drain and wait at most `timeout` s, then SIGKILL. The exit code (negative: killed)."""
        self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not Path(self.log_path).is_file():
            return ""
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:]) + "\n"

    def _hint(self) -> str:
        return f" (log {self.log_path})" if self.log_path else ""


def start_frontend(grpc_port: int, metrics_port: int, openai_port: int, model_dir, log_path=None,
                   host: str | None = None, served_model_names=None, drain_grace: float = 30.0,
                   log=print, env: dict | None = None) -> OpenAIFrontend:
    """Start the frontend against the Triton on 127.0.0.1:grpc_port (not waiting for it). env:
    variables set for it on top of this process's (e.g. VLLM_API_KEY: secrets go through the
    environment, never its command line)."""
    if log_path is not None:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = frontend_command(grpc_port, metrics_port, openai_port, model_dir, host, served_model_names, drain_grace)
    return OpenAIFrontend(cmd, openai_port, log_path, log, env)
