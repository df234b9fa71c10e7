"""The worker processes of a tensor-parallel engine: how they are started, watched, named and
stopped, and how a worker makes sure it never outlives the engine process.

A worker never outlives its engine: PR_SET_PDEATHSIG (SIGKILL) tied to the thread that started it
(a keeper thread that lives as long as the workers do), a thread in the worker that exits when its
parent pid changes, and the socket's end of file when the engine is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from multiprocessing.connection import Connection

from paddle_llm_engine.executor.channel import Stop
from paddle_llm_engine.platforms.interpreter import python_executable

STOP_GRACE_S = 5.0
PR_SET_PDEATHSIG = 1
WORKER_MODULE = "paddle_llm_engine.executor.tp_worker"


def free_port() -> int:
    """A loopback TCP port free right now (the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(proc: subprocess.Popen) -> str:
    """How a worker ended, for error messages: "still running", "killed by SIGKILL", "exited with code 1"
    (a remote rank, remote.RemoteRank, describes itself)."""
    if hasattr(proc, "describe"):
        return proc.describe()
    code = proc.poll()
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def spawn_workers(envs: list[dict], procs: list) -> list[Connection]:
    """Start one worker per environment (`python -m WORKER_MODULE <fd> <engine pid>`), appending
    their Popen objects to `procs`; returns the engine's ends of their sockets, in rank order.

    The workers are started from a keeper thread that then waits for them: their PR_SET_PDEATHSIG
    fires when the thread that started them exits, so it must live as long as they do. Raises
    RuntimeError when a worker cannot be started (those started are in `procs` for the caller to stop)."""
    python = python_executable()
    pairs = [socket.socketpair() for _ in envs]
    ready = threading.Event()
    failure: list[BaseException] = []

    def keeper():
        try:
            for env, (_, child) in zip(envs, pairs):
                fd = child.fileno()
                procs.append(subprocess.Popen([python, "-m", WORKER_MODULE, str(fd), str(os.getpid())],
                                              env=env, pass_fds=(fd,), stdin=subprocess.DEVNULL))
        except BaseException as e:
            failure.append(e)
        finally:
            for _, child in pairs:
                child.close()
            ready.set()
        for p in list(procs):
            p.wait()

    threading.Thread(target=keeper, name="tp-workers", daemon=True).start()
    ready.wait()
    conns = [Connection(parent.detach()) for parent, _ in pairs]
    if failure:
        for c in conns:
            c.close()
        raise RuntimeError(f"cannot start the tensor-parallel workers: {failure[0]}")
    return conns


def stop_workers(procs: list, conns: list, logits_path: str | None) -> None:
    """Stop every worker (close() and the finalizer): Stop(), STOP_GRACE_S, SIGKILL (a remote rank:
    its connection closed); close the sockets and remove the logits file if it is still there."""
    for c in conns:
        try:
            c.send(Stop())
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            try:
                p.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
    for c in conns:
        try:
            c.close()
        except OSError:
            pass
    for p in procs:
        getattr(p, "release", lambda: None)()  # a remote rank's own handle on its socket
    if logits_path:
        try:
            os.unlink(logits_path)
        except FileNotFoundError:
            pass
    procs.clear()
    conns.clear()


def watch_parent(parent_pid: int) -> None:
    """Worker side: die with the engine process. PDEATHSIG now, and a thread polling the parent pid
    (for a parent thread that exits while its process lives on, or a kernel without prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(3)

    def poll():
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=poll, name="tp-parent-watch", daemon=True).start()
