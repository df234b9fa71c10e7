"""Start the tritonserver binary of the nvidia-pytriton wheel on CPU, wait for it, stop it cleanly.

Used two ways:
- `scripts/serve.sh` execs it in foreground mode (`python scripts/launch_triton.py ...`): it prints the
  start-up time (until /v2/health/ready answers 200) and forwards Ctrl-C / SIGTERM to the server;
- tests import it: `start_server(...)` returns a `TritonServer` handle with `wait_ready(timeout)` and
  `stop()`.

Shutdown: SIGTERM to tritonserver (which runs with `--exit-timeout-secs`), then a watchdog. Triton 2.51
can hang past its exit timeout with an open gRPC stream and leave the Python backend's shared-memory
regions behind, so if the server has not exited `kill_after` seconds after the signal, it and the
`triton_python_backend_stub` processes it spawned are SIGKILLed, and the
`/dev/shm/triton_python_backend_shm_region_*` files this server owned are removed. A region counts as
owned when one of this server's processes had it mapped (read from /proc/PID/maps just before the
kill), or when it appeared after this server started and no live process maps it any more.

Environment of the server (DESIGN 4): the venv's bin first on PATH (that is how the stub finds the
venv's site-packages; PYTHONPATH is ignored) and the base interpreter's own lib directory first on
LD_LIBRARY_PATH (so the stub does not mix a distribution libpython with the venv's). The model folder
reaches the llm model as env var PADDLE_LLM_MODEL_DIR; its config parameter `model_dir`, when set to a
non-empty value, wins over the variable.

Only the standard library is used here.
"""

from __future__ import annotations

import argparse
import ctypes
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

REPO_ROOT = Path(__file__).resolve().parent.parent
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
STUB_NAME = "triton_python_backend_stub"
MODEL_DIR_ENV = "PADDLE_LLM_MODEL_DIR"


# --------------------------------------------------------------------------- locating things


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


# --------------------------------------------------------------------------- /proc helpers


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, None if it is gone or a zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def _children(ppid: int) -> dict[int, int]:
    """{pid: start time} of the direct children of ppid."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st and st[0] == ppid:
                out[int(entry)] = st[1]
    return out


def _mapped_regions(pid: int) -> set[str]:
    """Triton Python-backend shm region files mapped by a process."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find(str(SHM_DIR / SHM_PREFIX))
                if i >= 0:
                    found.add(line[i:].strip().replace(" (deleted)", ""))
    except OSError:
        pass
    return found


def _stub_region(pid: int) -> str | None:
    """The shm region a stub was started with: its argv is `stub model.py <region name> ...`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if len(argv) > 2 and argv[0].endswith(STUB_NAME.encode()) and argv[2].startswith(SHM_PREFIX.encode()):
        return str(SHM_DIR / argv[2].decode())
    return None


def _regions_now() -> set[str]:
    try:
        return {str(SHM_DIR / n) for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIX)}
    except OSError:
        return set()


def _regions_mapped_by_anyone() -> set[str]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found |= _mapped_regions(int(entry))
    return found


def _set_parent_death_signal() -> None:
    """In the child before exec: own process group, and SIGTERM if the launcher dies (Linux only)."""
    os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


# --------------------------------------------------------------------------- the handle


class TritonServer:
    """A running tritonserver process; `stop()` shuts it down cleanly (see module doc)."""

    def __init__(self, proc: subprocess.Popen, http_port: int, grpc_port: int, metrics_port: int,
                 log_path: Path | None, shm_before: set[str], exit_timeout: int, kill_after: float):
        self.proc = proc
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
        self._shm_before = shm_before
        self._stubs: dict[int, int] = {}  # pid -> start time (guards against pid reuse)
        self._owned_regions: set[str] = set()
        self._stop_lock = threading.Lock()
        self.killed = False

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
        server exits first and TimeoutError after `timeout` seconds (the server keeps running)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.proc.returncode} before ready"
                                   + self._log_hint())
            if self.is_ready():
                self.ready_after = time.monotonic() - self.started_at
                self._remember_stubs()
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

    def _remember_stubs(self) -> None:
        """Record the server's current children (stubs) and the shm regions they were given."""
        if self.proc.poll() is None:
            for pid, start in _children(self.pid).items():
                if pid not in self._stubs:
                    self._stubs[pid] = start
                    region = _stub_region(pid)
                    if region:
                        self._owned_regions.add(region)

    def stop(self, kill_after: float | None = None) -> int:
        """SIGTERM, wait up to kill_after seconds, then SIGKILL server and stubs; clean shm. Returns
        the server's exit code (negative signal number if killed). Safe to call more than once."""
        kill_after = self.kill_after if kill_after is None else kill_after
        with self._stop_lock:
            if self.proc.poll() is None:
                self._remember_stubs()
                try:
                    self.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + kill_after
                while self.proc.poll() is None and time.monotonic() < deadline:
                    self._remember_stubs()
                    time.sleep(0.1)
                if self.proc.poll() is None:
                    self._kill()
            self.proc.wait()
            self._kill_leftover_stubs()
            self._clean_shm()
            return self.proc.returncode

    def _kill(self) -> None:
        self.killed = True
        self._remember_stubs()
        self._owned_regions |= _mapped_regions(self.pid)
        for pid in self._stubs:
            self._owned_regions |= _mapped_regions(pid)
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
            st = _stat(pid)
            if st is None or st[1] != start:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                (st := _stat(p)) is not None and st[1] == s for p, s in self._stubs.items()):
            time.sleep(0.05)

    def _clean_shm(self) -> None:
        owned = set(self._owned_regions)
        new = _regions_now() - self._shm_before
        if new:
            owned |= new - _regions_mapped_by_anyone()
        for path in owned:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                print(f"launch_triton: could not remove {path}: {e}", file=sys.stderr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def server_command(model_repo, http_port, grpc_port, metrics_port, backend_dir=None,
                   exit_timeout: int = 5, extra_args=()) -> list[str]:
    backend_dir = Path(backend_dir or REPO_ROOT / "build" / "triton_backends")
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
                 kill_after: float = 15.0, env: dict | None = None, python_bin=None) -> TritonServer:
    """Start tritonserver (not waiting for it). log_path None: output goes to this process's stdout.
    env: the server's base environment (default os.environ); python_bin: see server_env."""
    backend_dir = Path(backend_dir or REPO_ROOT / "build" / "triton_backends")
    if not (backend_dir / "python" / STUB_NAME).is_file():
        raise FileNotFoundError(f"{backend_dir}/python/{STUB_NAME} missing (run scripts/setup.sh)")
    cmd = server_command(model_repo, http_port, grpc_port, metrics_port, backend_dir,
                         exit_timeout, extra_args)
    out = None
    if log_path is not None:
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "wb")
    shm_before = _regions_now()
    try:
        proc = subprocess.Popen(cmd, env=server_env(model_dir, env, python_bin), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT if out else None,
                                preexec_fn=_set_parent_death_signal, close_fds=True)
    finally:
        if out is not None:
            out.close()
    return TritonServer(proc, http_port, grpc_port, metrics_port, log_path, shm_before,
                        exit_timeout, kill_after)


# --------------------------------------------------------------------------- foreground mode


def main(argv=None) -> int:
    env = os.environ
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Arguments after -- go to tritonserver unchanged.")
    ap.add_argument("--model-repo", default=env.get("MODEL_REPO", str(REPO_ROOT / "model_repository")))
    ap.add_argument("--model-dir", default=env.get("MODEL_DIR", str(REPO_ROOT / "build" / "SmolLM2-135M-Instruct")))
    ap.add_argument("--http-port", type=int, default=int(env.get("HTTP_PORT", 8000)))
    ap.add_argument("--grpc-port", type=int, default=int(env.get("GRPC_PORT", 8001)))
    ap.add_argument("--metrics-port", type=int, default=int(env.get("METRICS_PORT", 8002)))
    ap.add_argument("--backend-dir", default=str(REPO_ROOT / "build" / "triton_backends"))
    ap.add_argument("--log-file", default=None, help="server output to this file instead of stdout")
    ap.add_argument("--exit-timeout-secs", type=int, default=5)
    ap.add_argument("--kill-after", type=float, default=float(env.get("TRITON_KILL_AFTER", 15)),
                    help="seconds after SIGTERM before the watchdog SIGKILLs server and stubs")
    ap.add_argument("--ready-timeout", type=float, default=0,
                    help="give up (and stop the server) if not ready after this many seconds; 0 = wait")
    ap.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    stop_signal: list[int] = []

    def on_signal(signum, _frame):
        stop_signal.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    server = start_server(args.model_repo, args.http_port, args.grpc_port, args.metrics_port,
                          model_dir=args.model_dir, log_path=args.log_file, backend_dir=args.backend_dir,
                          extra_args=args.extra, exit_timeout=args.exit_timeout_secs,
                          kill_after=args.kill_after)
    print(f"launch_triton: tritonserver pid {server.pid}, model repository {Path(args.model_repo).resolve()}, "
          f"{MODEL_DIR_ENV}={Path(args.model_dir).resolve()}", flush=True)

    ready_reported = False
    while not stop_signal and server.proc.poll() is None:
        if not ready_reported and server.is_ready():
            server.ready_after = time.monotonic() - server.started_at
            print(f"launch_triton: ready in {server.ready_after:.2f} s: http 127.0.0.1:{args.http_port}, "
                  f"grpc 127.0.0.1:{args.grpc_port}, metrics 127.0.0.1:{args.metrics_port}", flush=True)
            ready_reported = True
            server._remember_stubs()
        elif (not ready_reported and args.ready_timeout
              and time.monotonic() - server.started_at > args.ready_timeout):
            print(f"launch_triton: not ready after {args.ready_timeout:.0f} s, stopping", flush=True)
            server.stop()
            return 1
        time.sleep(0.1 if not ready_reported else 0.5)

    if stop_signal:
        print(f"launch_triton: signal {signal.Signals(stop_signal[0]).name}, stopping tritonserver "
              f"(watchdog {args.kill_after:.0f} s)", flush=True)
    code = server.stop()
    if server.killed:
        print("launch_triton: tritonserver did not exit in time: killed it and its stubs", flush=True)
    print(f"launch_triton: tritonserver exited with code {code}", flush=True)
    if stop_signal:  # asked to stop: success only if the server shut down by itself
        return 0 if code == 0 and not server.killed else 1
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
