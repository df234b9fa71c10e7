"""The handle of a running tritonserver (`TritonServer`): readiness, restart, drain, and a clean stop.

Shutdown: SIGTERM to tritonserver (which runs with `--exit-timeout-secs`), then a watchdog. Triton 2.51
can hang past its exit timeout with an open gRPC stream and leave the Python backend's shared-memory
regions behind, so if the server has not exited `kill_after` seconds after the signal, it and the
`triton_python_backend_stub` processes it spawned are SIGKILLed, and the
`/dev/shm/triton_python_backend_shm_region_*` files this server owned are removed. A region counts as
owned when one of this server's processes had it mapped (read from /proc/PID/maps just before the
kill) or a stub of this server was started with it (its argv, recorded while the server runs).

Only the standard library is used here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from paddle_llm_launcher import procs
from paddle_llm_launcher.admin_api import AdminAccess

class TritonServer:
    """A running tritonserver process; `stop()` shuts it down cleanly (see module doc)."""

    def __init__(self, proc: subprocess.Popen, http_port: int, grpc_port: int, metrics_port: int,
                 log_path: Path | None, exit_timeout: int, kill_after: float, admin: AdminAccess | None = None):
        self.proc = proc
        self.admin = admin or AdminAccess((), "")
        # what an HTTP client sends to call a restricted API (repository load / unload); never logged
        self.admin_headers = self.admin.http_headers()
        self.pid = proc.pid
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.http_url = f"127.0.0.1:{http_port}"  # tritonclient style (no scheme)
        self.grpc_url = f"127.0.0.1:{grpc_port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.log_path = log_path
        self.exit_timeout = exit_timeout
        self.kill_after = kill_after
        self.started_at = time.monotonic()
        self.ready_after: float | None = None  # seconds from start to ready
        self._stubs: dict[int, int] = {}  # pid -> start time (guards against pid reuse)
        self._owned_regions: set[str] = set()
        self._stop_lock = threading.Lock()
        self.killed = False
        self.supervisor = None      # a launcher.supervisor.Supervisor in supervised mode
        self.drain_accept_s = 0.0   # drain()'s accept window (DRAIN_ACCEPT_S, read by start_server)
        self.gate = None            # its launcher.gate.ReadinessGate
        self._restarting = False
        self.state_dir: Path | None = None

    def repository(self):
        """A RepositoryClient for this server: its admin headers, loads over gRPC."""
        from paddle_llm_launcher.repository import RepositoryClient

        return RepositoryClient(self.http_port, headers=self.admin_headers, grpc_port=self.grpc_port,
                                grpc_headers=self.admin.grpc_headers())

    # ---- readiness

    def is_ready(self) -> bool:
        url = f"http://127.0.0.1:{self.http_port}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 180.0, poll: float = 0.1) -> float:
        """Poll /v2/health/ready until 200; return seconds since start. Raises RuntimeError if the
        server exits first (its stubs killed and their shm regions removed: a server that crashes
        while loading leaves them behind) and TimeoutError after `timeout` seconds (the server keeps
        running)."""
        deadline = time.monotonic() + timeout
        while True:
            self.note_loading()
            if self.proc.poll() is not None:
                self._kill_leftover_stubs()
                self._clean_shm()
                raise RuntimeError(f"tritonserver exited with code {self.proc.returncode} before ready"
                                   + self._log_hint())
            if self.is_ready():
                self.ready_after = time.monotonic() - self.started_at
                self.remember_stubs()
                if self.supervisor is not None and not self.supervisor._thread.is_alive():
                    self.supervisor.start()
                return self.ready_after
            if time.monotonic() >= deadline:
                raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s" + self._log_hint())
            time.sleep(poll)

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path or not Path(self.log_path).is_file():
            return ""
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def _log_hint(self) -> str:
        return f" (log: {self.log_path})" if self.log_path else ""

    # ---- shutdown

    def note_loading(self) -> None:
        """Record the stubs and shm regions of a server still loading its models: supervision starts
        only once it is ready, so should it die before, stop() (or wait_ready()) still removes them.
        Call it on every poll while waiting for readiness."""
        self.remember_stubs()
        if self.proc.poll() is None:
            self._owned_regions |= procs.mapped_regions(self.pid)

    def remember_stubs(self) -> None:
        """Record the server's current children (stubs) and the shm regions they were given."""
        if self.proc.poll() is None:
            for pid, start in procs.children(self.pid).items():
                if pid not in self._stubs:
                    self._stubs[pid] = start
                    region = procs.stub_region(pid)
                    if region:
                        self._owned_regions.add(region)

    def restart(self) -> None:
        """Kill this tritonserver (SIGKILL of the server and its stubs, their shm regions removed) and
        start the same command again on the same ports; the log file is appended to. The supervisor
        does this when a model cannot be reloaded: Triton 2.51 never releases the requests that were
        in flight on a stub that died, so unloading its model never completes. Returns at once;
        wait_ready() as after a start."""
        with self._stop_lock:
            self._restarting = True
            if self.proc.poll() is None:
                self._kill()
            self.proc.wait()
            self._kill_leftover_stubs()
            self._clean_shm()
            self._stubs.clear()
            self._owned_regions.clear()
            self.killed = False
            self.proc = _popen(self._launch, self.log_path, "ab")
            self.pid = self.proc.pid
            self.started_at = time.monotonic()
            self.ready_after = None
            self._restarting = False
            if self.gate is not None:
                self.gate.reset()

    def running(self) -> bool:
        """The server process runs (or is being restarted by the supervisor)."""
        return self._restarting or self.proc.poll() is None

    def drain(self, grace_s: float = 30.0, log=print, accept_s: float | None = None) -> dict:
        """Supervised mode only: readiness false, refuse new requests (after accept_s seconds; None:
        the server's DRAIN_ACCEPT_S, default 0), wait for the requests in flight (at most grace_s),
        unload every model (shutdown.py). Call stop() after it."""
        from paddle_llm_launcher.shutdown import drain

        if self.supervisor is None:
            raise RuntimeError("drain() needs a server started with supervise=True")
        self.supervisor.pause()
        return drain(self, grace_s, log, self.drain_accept_s if accept_s is None else accept_s)

    def stop(self, kill_after: float | None = None) -> int:
        """SIGTERM, wait up to kill_after seconds, then SIGKILL server and stubs; clean shm. Returns
        the server's exit code (negative signal number if killed). Safe to call more than once."""
        kill_after = self.kill_after if kill_after is None else kill_after
        if self.supervisor is not None:
            self.supervisor.stop()
        with self._stop_lock:
            if self.proc.poll() is None:
                self.remember_stubs()
                try:
                    self.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
                if self.gate is not None:
                    self.gate.shut()  # only now: the server answers not ready from its SIGTERM on
                    self.gate.finish()  # and unload it while Triton still takes gRPC calls
                deadline = time.monotonic() + kill_after
                while self.proc.poll() is None and time.monotonic() < deadline:
                    self.remember_stubs()
                    time.sleep(0.1)
                if self.proc.poll() is None:
                    self._kill()
            self.proc.wait()
            self._kill_leftover_stubs()
            self._clean_shm()
            if self.state_dir is not None:
                import shutil

                shutil.rmtree(self.state_dir, ignore_errors=True)
            return self.proc.returncode

    def _kill(self) -> None:
        self.killed = True
        self.remember_stubs()
        self._owned_regions |= procs.mapped_regions(self.pid)
        for pid in self._stubs:
            self._owned_regions |= procs.mapped_regions(pid)
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the server leads its own process group
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass

    def _kill_leftover_stubs(self) -> None:
        """SIGKILL remembered stub children that are still alive (same pid and start time)."""
        for pid, start in self._stubs.items():
            st = procs.proc_stat(pid)
            if st is None or st[1] != start:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                (st := procs.proc_stat(p)) is not None and st[1] == s for p, s in self._stubs.items()):
            time.sleep(0.05)

    def _clean_shm(self) -> None:
        # only regions known to be this server's: a region that merely appeared meanwhile may be
        # another server's, being created right now (several servers start and stop side by side
        # in tests and soaks)
        for path in set(self._owned_regions):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                print(f"launcher: could not remove {path}: {e}", file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# Triton's GPU build logs these at error level on every host without a CUDA driver (its CUDA memory
# block manager stays off; nothing here uses it): a healthy CPU host should print no error line.
BENIGN_ERROR_LINES = (b'"CudaDriverHelper has not been initialized."',)
_BENIGN_NOTE = b" (an info line here: Triton logs it as an error on every host without a CUDA driver)"


def relay_line(line: bytes) -> bytes:
    """One line of tritonserver's output as the launcher passes it on: a known benign error line
    (BENIGN_ERROR_LINES) becomes an info line saying why; every other line is unchanged."""
    if line.startswith(b"E") and any(m in line for m in BENIGN_ERROR_LINES):
        return b"I" + line[1:].rstrip(b"\n") + _BENIGN_NOTE + b"\n"
    return line


def _relay(src, write, close) -> None:
    """Copy src (tritonserver's output pipe) line by line through relay_line() to write(bytes) until
    every writer (the server and its stubs) is gone. Should the destination fail, the pipe is still
    drained: a full pipe would block the server and its stubs."""
    try:
        for line in iter(src.readline, b""):
            write(relay_line(line))
    except (OSError, ValueError):
        for _ in iter(src.readline, b""):
            pass
    finally:
        src.close()
        close()


def _stdout_writer():
    """(write, close) for the launcher's own stdout, binary when it has a buffer."""
    buf = getattr(sys.stdout, "buffer", None)
    if buf is not None:
        return (lambda b: (buf.write(b), buf.flush())), (lambda: None)
    return (lambda b: (sys.stdout.write(b.decode("utf-8", "replace")), sys.stdout.flush())), (lambda: None)


def _popen(launch, log_path: Path | None, mode: str) -> subprocess.Popen:
    """Start tritonserver with its stdout and stderr on one pipe, relayed line by line (relay_line)
    to log_path (opened with `mode`) or to this process's stdout by a daemon thread."""
    cmd, env = launch
    if log_path is not None:
        out = open(log_path, mode)
        write, close = (lambda b: (out.write(b), out.flush())), out.close
    else:
        write, close = _stdout_writer()
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, preexec_fn=procs.set_parent_death_signal, close_fds=True)
    except BaseException:
        close()
        raise
    threading.Thread(target=_relay, args=(proc.stdout, write, close), name="tritonserver-output",
                     daemon=True).start()
    return proc
