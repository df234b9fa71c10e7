"""Run tritonserver in the foreground with this repository: `make serve` (scripts/serve.sh) execs it.

Prints the start-up time (until /v2/health/ready answers 200). By default the server is supervised
(paddle_llm_launcher/supervisor.py: a model whose stub dies or whose engine fails is reloaded by
itself) and Ctrl-C / SIGTERM / SIGHUP drain it (paddle_llm_launcher/shutdown.py: readiness false at
once, new requests UNAVAILABLE, requests in flight finish within --drain-grace seconds, exit code 0).
--no-supervise runs plain tritonserver (default model control, no drain: the signal goes straight to
tritonserver). The watchdog, the server's environment and the clean stop are paddle_llm_launcher's
(see its server.py, handle.py and environment.py).

The OpenAI API frontend (`python -m paddle_llm_openai`, paddle_llm_launcher/frontend.py) runs beside
it on --openai-port (scripts/serve.sh: OPENAI_PORT, default 9000; 0 or absent: none): restarted if it
dies; on a stop signal it drains first (ready false, new requests 503, its requests in flight finish)
while Triton drains.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

from paddle_llm_launcher import DEFAULT_BACKEND_DIR, MODEL_DIR_ENV, REPO_ROOT, start_server
from paddle_llm_launcher import free_port, server_env  # noqa: F401  (callers that load this file)
from paddle_llm_launcher.frontend import start_frontend
from paddle_llm_launcher.shutdown import clean_despite_exit_code



def say(line: str) -> None:
    """One launcher / supervisor line on stdout, prefixed with the UTC time to the millisecond (a
    recovery's steps are seconds apart: the operator reads them off these)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"{now:%Y-%m-%d %H:%M:%S}.{now.microsecond // 1000:03d} {line}", flush=True)


def _overlay(args, env) -> str:
    """The repository to serve: args.model_repo, or a copy under build/serve_repository/<http port>/
    with the LLM_PARAMS / --set overrides (paddle_llm_launcher/overrides.py), logged. Raises ValueError."""
    from paddle_llm_launcher import overrides as ov

    wanted = ov.parse_overrides([env.get("LLM_PARAMS", ""), *args.set])
    if not wanted:
        return args.model_repo
    ov.check_keys(wanted)
    dest = ov.overlay_repository(Path(args.model_repo), REPO_ROOT / "build" / "serve_repository" / str(args.http_port),
                                 wanted)
    say(f"launch_triton: llm parameters set: {' '.join(f'{k}={v}' for k, v in wanted.items())} "
        f"(serving the copy {dest}; {Path(args.model_repo).resolve()} is unchanged)")
    return str(dest)


def _parser(env) -> argparse.ArgumentParser:
    """The command line; defaults from the environment variables scripts/serve.sh documents."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Arguments after -- go to tritonserver unchanged.")
    ap.add_argument("--model-repo", default=env.get("MODEL_REPO", str(REPO_ROOT / "model_repository")),
                    help="the Triton model repository to serve")
    ap.add_argument("--model-dir", default=env.get("MODEL_DIR", str(REPO_ROOT / "build" / "SmolLM2-135M-Instruct")),
                    help="HF model folder; reaches the models as PADDLE_LLM_MODEL_DIR (used where config.pbtxt "
                         "leaves model_dir empty)")
    ap.add_argument("--http-port", type=int, default=int(env.get("HTTP_PORT", 8000)), help="Triton's HTTP port")
    ap.add_argument("--grpc-port", type=int, default=int(env.get("GRPC_PORT", 8001)), help="Triton's gRPC port")
    ap.add_argument("--metrics-port", type=int, default=int(env.get("METRICS_PORT", 8002)),
                    help="Triton's metrics port (Prometheus text on /metrics)")
    ap.add_argument("--backend-dir", default=str(DEFAULT_BACKEND_DIR),
                    help="tritonserver's --backend-directory (the Python backend scripts/setup.sh assembles)")
    ap.add_argument("--log-file", default=None, help="server output to this file instead of stdout")
    ap.add_argument("--exit-timeout-secs", type=int, default=10,
                    help="tritonserver's --exit-timeout-secs: how long it waits for models to unload at exit "
                         "(the readiness gate's load ends after the SIGTERM and its unload takes 2-4 s)")
    ap.add_argument("--kill-after", type=float, default=float(env.get("TRITON_KILL_AFTER", 15)),
                    help="seconds after SIGTERM before the watchdog SIGKILLs server and stubs")
    ap.add_argument("--no-supervise", action="store_true",
                    help="plain tritonserver: no supervisor (no reload of a failed model), no drain on SIGTERM")
    ap.add_argument("--drain-grace", type=float, default=float(env.get("DRAIN_GRACE_S", 30)),
                    help="seconds the requests in flight get to finish after SIGTERM (default 30)")
    ap.add_argument("--ready-timeout", type=float, default=0,
                    help="give up (and stop the server) if not ready after this many seconds; 0 = wait")
    ap.add_argument("--openai-port", type=int, default=int(env.get("OPENAI_PORT", 0)),
                    help="port of the OpenAI API frontend started beside tritonserver (default 0: none; "
                         "scripts/serve.sh passes OPENAI_PORT, default 9000)")
    ap.add_argument("--served-model-name", nargs="+", default=env.get("SERVED_MODEL_NAME", "").split() or None,
                    help="model names the OpenAI frontend serves (default: the model folder's name and llm)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="set a parameter of the llm model (any config.pbtxt parameter, e.g. quantization=wint8, "
                         "or instances=N) in a copy of the repository under build/; repeatable; also the "
                         "environment variable LLM_PARAMS (space-separated KEY=VALUE, --set wins)")
    ap.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    return ap


def _start_frontend(args, server):
    """Announce the started tritonserver and start the OpenAI frontend when asked: the frontend's
    handle or None."""
    if not server.admin.apis:
        say("launch_triton: WARNING: TRITON_RESTRICTED_APIS=none: Triton's model-repository API is open to every "
            "client that reaches the HTTP / gRPC ports, and a model load can carry Python code (docs/security.md)")
    say(f"launch_triton: tritonserver pid {server.pid}, model repository {Path(args.model_repo).resolve()}, "
        f"{MODEL_DIR_ENV}={Path(args.model_dir).resolve()}")
    frontend = None
    if args.openai_port and importlib.util.find_spec("fastapi") is None:
        say("launch_triton: OpenAI frontend not started: it needs Python >= 3.11 (fastapi, uvicorn; "
            "scripts/setup.sh installs them there)")
    elif args.openai_port:
        frontend = start_frontend(args.grpc_port, args.metrics_port, args.openai_port, args.model_dir,
                                  served_model_names=args.served_model_name, drain_grace=args.drain_grace,
                                  log=say)
        say(f"launch_triton: OpenAI frontend pid {frontend.pid} on {frontend.url}")
    return frontend


def _serve(args, server, frontend, stop_signal: list) -> bool | None:
    """Wait for readiness (announced once), then keep the frontend alive until a stop signal or the
    server's end. Returns whether readiness was reached, or None after --ready-timeout (all stopped)."""
    openai_note = f", openai {frontend.url}" if frontend is not None else ""
    ready_reported = False
    # supervised and once ready: tritonserver may exit and be restarted by the supervisor meanwhile
    while not stop_signal and (server.running() or (server.supervisor is not None and ready_reported)):
        if not ready_reported:
            server.note_loading()  # should it die while loading, stop() below still cleans up
        if not ready_reported and server.is_ready():
            server.ready_after = time.monotonic() - server.started_at
            say(f"launch_triton: ready in {server.ready_after:.2f} s: http 127.0.0.1:{args.http_port}, "
                f"grpc 127.0.0.1:{args.grpc_port}, metrics 127.0.0.1:{args.metrics_port}{openai_note}")
            ready_reported = True
            server.remember_stubs()
            if server.supervisor is not None:
                server.supervisor.start()
        elif (not ready_reported and args.ready_timeout
              and time.monotonic() - server.started_at > args.ready_timeout):
            say(f"launch_triton: not ready after {args.ready_timeout:.0f} s, stopping")
            server.stop()
            if frontend is not None:
                frontend.stop(10)
            return None
        if frontend is not None:
            frontend.poll_restart()
        time.sleep(0.1 if not ready_reported else 0.5)
    return ready_reported


def _stop(args, server, frontend, stop_signal: list, ready_reported: bool) -> int:
    """Drain (on a stop signal, supervised and ready), stop both processes; the exit code."""
    drained = None  # the drain's summary (paddle_llm_launcher/shutdown.py)
    if stop_signal:
        say(f"launch_triton: signal {signal.Signals(stop_signal[0]).name}, stopping tritonserver "
            f"(watchdog {args.kill_after:.0f} s)")
        if frontend is not None:
            frontend.terminate()  # drains beside Triton: its streams finish, new requests 503
        if server.supervisor is not None and ready_reported and server.running():
            drained = server.drain(args.drain_grace, log=say)
    if frontend is not None:
        fcode = frontend.stop(args.drain_grace + 5)
        say(f"launch_triton: OpenAI frontend exited with code {fcode}")
    code = server.stop()
    if server.killed:
        say("launch_triton: tritonserver did not exit in time: killed it and its stubs")
    say(f"launch_triton: tritonserver exited with code {code}")
    if not ready_reported and not stop_signal:
        where = args.log_file or "the output above"
        say(f"launch_triton: tritonserver ended before it was ready: the reason is in its error lines "
            f"(starting with E, e.g. a model that failed to load) in {where}")
    if stop_signal:  # asked to stop: success only if the server shut down by itself and lost nothing
        if clean_despite_exit_code(drained, code, server.killed):
            how = "was killed after it" if server.killed else f"exited with code {code}"
            say(f"launch_triton: every request finished; tritonserver {how} only because it did not unload "
                f"{', '.join(drained['stuck'])} before its exit timeout (held inside Triton, e.g. by a client's "
                f"gRPC stream left open): exit 0")
            return 0
        return 0 if code == 0 and not server.killed else 1
    return code if code >= 0 else 128 - code


def main(argv=None) -> int:
    """Serve until a stop signal (see the module doc). Returns the process's exit code: 0 after a
    clean drain, 1 when not ready within --ready-timeout or when requests were lost, 2 for a bad
    setting, else tritonserver's own code."""
    env = os.environ
    args = _parser(env).parse_args(argv)
    try:
        args.model_repo = _overlay(args, env)
    except ValueError as e:
        say(f"launch_triton: {e}")
        return 2

    stop_signal: list[int] = []

    def on_signal(signum, _frame):
        stop_signal.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        server = start_server(args.model_repo, args.http_port, args.grpc_port, args.metrics_port,
                              model_dir=args.model_dir, log_path=args.log_file, backend_dir=args.backend_dir,
                              extra_args=args.extra, exit_timeout=args.exit_timeout_secs,
                              kill_after=args.kill_after, supervise=not args.no_supervise, log=say)
    except ValueError as e:  # a bad setting (TRITON_RESTRICTED_APIS, TRITON_ADMIN_KEY, DRAIN_ACCEPT_S, ...)
        say(f"launch_triton: {e}")
        return 2
    frontend = _start_frontend(args, server)
    ready_reported = _serve(args, server, frontend, stop_signal)
    if ready_reported is None:
        return 1
    return _stop(args, server, frontend, stop_signal, ready_reported)

if __name__ == "__main__":
    sys.exit(main())
