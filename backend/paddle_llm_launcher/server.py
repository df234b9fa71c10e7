"""Start the tritonserver binary of the nvidia-pytriton wheel on CPU, wait for it, stop it cleanly.

`start_server(...)` returns a `TritonServer` handle with `wait_ready(timeout)` and `stop()`; tests,
benchmarks and scripts/launch_triton.py (foreground mode, `make serve`) all start servers this way.

The handle and its clean stop (SIGTERM, then a kill watchdog, then the shared-memory regions this
server owned removed): handle.py. The server's environment (`server_env`, the one place that builds
it) and free ports: environment.py.

Supervised mode (`start_server(supervise=True)`, what `make serve` runs): tritonserver runs with
`--model-control-mode explicit`, `--load-model` for every model of the repository, and a second
repository holding the readiness gate (gate.py, loaded only to turn readiness false); once ready,
a Supervisor thread (supervisor.py) reloads any model whose stub dies or whose
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

import os
from pathlib import Path

from paddle_llm_launcher.admin_api import AdminAccess, admin_access
from paddle_llm_launcher.environment import DEFAULT_BACKEND_DIR, server_env, tritonserver_binary
from paddle_llm_launcher.handle import TritonServer, _popen
from paddle_llm_launcher.procs import STUB_NAME
from paddle_llm_triton.lifecycle.restarts import STATE_ENV


def server_command(model_repo, http_port, grpc_port, metrics_port, backend_dir=None,
                   exit_timeout: int = 5, extra_args=()) -> list[str]:
    """The tritonserver argv: the repository, backends, the three ports on BIND_ADDRESS (default
    loopback), no GPU metrics, no pinned memory, `--exit-timeout-secs exit_timeout`, then extra_args.
    FileNotFoundError when the binary is missing."""
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

    from paddle_llm_launcher.gate import ReadinessGate, make_gate_repository
    from paddle_llm_launcher.shutdown import accept_seconds
    from paddle_llm_launcher.supervisor import Supervisor

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
        server.gate = ReadinessGate(server.repository(), state_dir)
        server.supervisor = Supervisor(server, state_dir, gate=server.gate, log=log, models=tuple(models))
    return server
