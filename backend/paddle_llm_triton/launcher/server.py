"""Start the tritonserver binary of the nvidia-pytriton wheel on CPU, wait for it, stop it cleanly.

`start_server(...)` returns a `TritonServer` handle with `wait_ready(timeout)` and `stop()`; tests,
benchmarks and scripts/launch_triton.py (foreground mode, `make serve`) all start servers this way.

Shutdown: SIGTERM to tritonserver (which runs with `--exit-timeout-secs`), then a watchdog. Triton 2.51
can hang past its exit timeout with an open gRPC stream and leave the Python backend's shared-memory
regions behind, so if the server has not exited `kill_after` seconds after the signal, it and the
`triton_python_backend_stub` processes it spawned are SIGKILLed, and the
`/dev/shm/triton_python_backend_shm_region_*` files this server owned are removed. A region counts as
owned when one of this server's processes had it mapped (read from /proc/PID/maps just before the
kill) or a stub of this server was started with it (its argv, recorded while the server runs).

Environment of the server (`server_env`, the one place that builds it): the venv's bin first on PATH
(that is how the stub finds the venv's site-packages; PYTHONPATH is ignored) and the base
interpreter's own lib directory first on LD_LIBRARY_PATH (so the stub does not mix a distribution
libpython with the venv's). The model folder reaches the llm model as env var PADDLE_LLM_MODEL_DIR;
its config parameter `model_dir`, when set to a non-empty value, wins over the variable.

Supervised mode (`start_server(supervise=True)`, what `make serve` runs): tritonserver runs with
`--model-control-mode explicit`, `--load-model` for every model of the repository, and a second
repository holding the readiness gate (gate.py, loaded only to turn readiness false); once ready, a Supervisor thread (supervisor.py) reloads any model whose stub dies or whose
engine reports unhealthy, and `drain(grace_s)` (shutdown.py) drains before `stop()` (with the accept
window DRAIN_ACCEPT_S, read at start: the seconds new requests are still served after readiness turned
false). The supervisor's state folder reaches the models as PADDLE_LLM_SUPERVISOR_STATE (restart counts).

Who may call the administrative APIs (admin_api.py): every server started here restricts Triton's
model-repository, shared-memory, trace and logging APIs to requests that carry the launcher's admin
header (a secret made per start unless TRITON_ADMIN_KEY is set; TRITON_RESTRICTED_APIS changes the
list). The handle's `admin_headers` open them for the supervisor, the readiness gate and the drain.

Only the standard library is used here.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from paddle_llm_triton.launcher import procs
from paddle_llm_triton.launcher.admin_api import AdminAccess, admin_access
from paddle_llm_triton.launcher.procs import STUB_NAME
from paddle_llm_triton.restarts import STATE_ENV

REPO_ROOT = Path(__file__).resolve().parents[3]  # the project is installed editable (scripts/setup.sh)
DEFAULT_BACKEND_DIR = REPO_ROOT / "build" / "triton_backends"
MODEL_DIR_ENV = "PADDLE_LLM_MODEL_DIR"


def pytriton_server_dir() -> Path:
    """`pytriton/tritonserver` inside the installed nvidia-pytriton wheel (found without importing it)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("nvidia-pytriton is not installed in this interpreter (run scripts/setup.sh)")
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


def tritonserver_binary() -> Path:
    path = pytriton_server_dir() / "bin" / "tritonserver"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    return path


def python_libdir() -> str:
    """The base interpreter's own lib directory (holds its libpython), also when running in a venv."""
    return sysconfig.get_config_var("LIBDIR") or str(Path(sys.base_prefix) / "lib")


def venv_bin() -> Path:
    return Path(sys.prefix) / "bin"


def _prepend(path_list: str | None, first: str) -> str:
    parts = [p for p in (path_list or "").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first] + parts)


def server_env(model_dir: str | os.PathLike | None, base: dict | None = None,
               python_bin: str | os.PathLike | None = None) -> dict:
    """python_bin: the bin folder put first on PATH (the stub uses that venv's packages); default
    this interpreter's venv (tests pass a throw-away venv layered on it)."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = _prepend(env.get("PATH"), str(python_bin or venv_bin()))
    env["LD_LIBRARY_PATH"] = _prepend(env.get("LD_LIBRARY_PATH"), python_libdir())
    env.pop("PYTHONHOME", None)
    if model_dir:
        env[MODEL_DIR_ENV] = str(Path(model_dir).resolve())
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on loopback (the OS picks it; tiny race until the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int = 3, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports (HTTP, gRPC, metrics)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return ports


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
        from paddle_llm_triton.launcher.shutdown import drain

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


def _popen(launch, log_path: Path | None, mode: str) -> subprocess.Popen:
    cmd, env = launch
    out = open(log_path, mode) if log_path is not None else None
    try:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT if out else None,
                                preexec_fn=procs.set_parent_death_signal, close_fds=True)
    finally:
        if out is not None:
            out.close()


def server_command(model_repo, http_port, grpc_port, metrics_port, backend_dir=None,
                   exit_timeout: int = 5, extra_args=()) -> list[str]:
    backend_dir = Path(backend_dir or DEFAULT_BACKEND_DIR)
    # Loopback unless the operator says otherwise (containers publishing ports set BIND_ADDRESS).
    host = os.environ.get("BIND_ADDRESS", "127.0.0.1")
    return [
        str(tritonserver_binary()),
        "--model-repository", str(Path(model_repo).resolve()),
        "--backend-directory", str(backend_dir.resolve()),
        "--http-address", host, "--http-port", str(http_port),
        "--grpc-address", host, "--grpc-port", str(grpc_port),
        "--metrics-address", host, "--metrics-port", str(metrics_port),
        "--allow-gpu-metrics", "false",
        "--pinned-memory-pool-byte-size", "0",
        "--disable-auto-complete-config",
        "--exit-timeout-secs", str(exit_timeout),
        *extra_args,
    ]


def start_server(model_repo, http_port: int, grpc_port: int, metrics_port: int, model_dir=None,
                 log_path=None, backend_dir=None, extra_args=(), exit_timeout: int = 5,
                 kill_after: float = 15.0, env: dict | None = None, python_bin=None,
                 supervise: bool = False, log=print, admin: AdminAccess | None = None) -> TritonServer:
    """Start tritonserver (not waiting for it). log_path None: output goes to this process's stdout.
    env: the server's base environment (default os.environ); python_bin: see server_env.
    supervise: supervised mode (see the module doc; the supervisor starts with wait_ready(), or call
    handle.supervisor.start() once ready); log(line): where the supervisor reports.
    admin: the restricted-API policy (default: admin_api.admin_access() from `env`: the repository,
    shared-memory, trace and logging APIs need the handle's admin_headers). Raises ValueError for a
    bad TRITON_RESTRICTED_APIS / TRITON_ADMIN_KEY, or restricted-API flags in extra_args."""
    import tempfile

    from paddle_llm_triton.launcher.gate import ReadinessGate, make_gate_repository
    from paddle_llm_triton.launcher.shutdown import accept_seconds
    from paddle_llm_triton.launcher.supervisor import Supervisor

    # a bad DRAIN_ACCEPT_S fails here, at start, not when the server is asked to stop
    drain_accept_s = accept_seconds() if supervise else 0.0
    if admin is None:
        admin = admin_access(os.environ if env is None else env, extra_args)
    backend_dir = Path(backend_dir or DEFAULT_BACKEND_DIR)
    if not (backend_dir / "python" / STUB_NAME).is_file():
        raise FileNotFoundError(f"{backend_dir}/python/{STUB_NAME} missing (run scripts/setup.sh)")
    state_dir = None
    if supervise:
        state_dir = Path(tempfile.mkdtemp(prefix="paddle_llm_supervisor_"))
        gate_repo = make_gate_repository(state_dir)
        models = sorted(d.name for d in Path(model_repo).iterdir() if (d / "config.pbtxt").is_file())
        extra_args = ["--model-repository", str(gate_repo), "--model-control-mode", "explicit",
                      *[a for m in models for a in ("--load-model", m)], *extra_args]
        env = dict(os.environ if env is None else env)
        env[STATE_ENV] = str(state_dir)
    cmd = server_command(model_repo, http_port, grpc_port, metrics_port, backend_dir,
                         exit_timeout, [*admin.server_args(), *extra_args])
    if log_path is not None:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
    launch = (cmd, server_env(model_dir, env, python_bin))
    server = TritonServer(_popen(launch, log_path, "wb"), http_port, grpc_port, metrics_port, log_path,
                          exit_timeout, kill_after, admin)
    server._launch = launch
    if supervise:
        server.drain_accept_s = drain_accept_s
        server.state_dir = state_dir
        server.gate = ReadinessGate(http_port, state_dir, server.admin_headers)
        server.supervisor = Supervisor(server, state_dir, gate=server.gate, log=log, models=tuple(models))
    return server
