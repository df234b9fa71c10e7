"""A tritonserver that dies while its models load (before it is ready) leaves no stub and no Python
backend shm region behind: the launcher records the stubs and regions while it waits for readiness,
and wait_ready() removes them when the server exits first (a new user's first `make serve` once died
of SIGBUS in a stub during loading and left a region in /dev/shm). The crash is a SIGKILL of the
tritonserver process alone, while its `llm` stub is still initializing the engine."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import paddle_llm_launcher as launcher
from paddle_llm_launcher import procs
from repo_edit import copy_repository

pytestmark = pytest.mark.e2e


def test_a_server_killed_while_loading_leaves_no_stub_and_no_shm_region(tmp_path, smollm2_dir):
    repo = copy_repository(tmp_path / "model_repository", ["llm"], None)
    handle = launcher.start_server(repo, *launcher.free_ports(3), model_dir=smollm2_dir,
                                   log_path=tmp_path / "tritonserver.log")
    outcome: dict = {}

    def wait():  # the launcher's own wait, polling while the models load
        try:
            outcome["ready_after"] = handle.wait_ready(timeout=120)
        except Exception as e:  # noqa: BLE001 (the assertion below names it)
            outcome["error"] = e

    waiter = threading.Thread(target=wait, daemon=True)
    try:
        waiter.start()
        stubs: dict[int, str] = {}
        deadline = time.monotonic() + 120
        while not stubs:  # the llm stub has started with its region
            assert time.monotonic() < deadline, "no stub started within 120 s\n" + handle.log_tail(30)
            assert handle.proc.poll() is None, "tritonserver exited before its stub started\n" + handle.log_tail(30)
            for pid in procs.children(handle.pid):
                region = procs.stub_region(pid)
                if region and Path(region).exists():
                    stubs[pid] = region
            time.sleep(0.05)
        time.sleep(0.5)  # a few of wait_ready()'s polls see the stub
        assert "ready_after" not in outcome and not handle.is_ready(), \
            "the server became ready before the crash could be simulated"
        os.kill(handle.pid, signal.SIGKILL)  # the server alone: its stubs stay until someone ends them
        waiter.join(60)
        assert isinstance(outcome.get("error"), RuntimeError) and "before ready" in str(outcome["error"]), outcome
        for pid, region in stubs.items():
            assert not Path(region).exists(), f"{region} left in /dev/shm"
            assert procs.proc_stat(pid) is None, f"stub {pid} still alive"
    finally:
        handle.stop()


def test_make_serve_launcher_killed_server_while_loading_exits_non_zero_and_cleans_up(tmp_path, smollm2_dir):
    """The same crash under `make serve`'s launcher (scripts/launch_triton.py, supervised): it exits
    with the server's code and leaves no stub and no region."""
    import subprocess
    import sys

    repo = copy_repository(tmp_path / "model_repository", ["llm"], None)
    http, grpc, metrics = launcher.free_ports(3)
    cmd = [sys.executable, str(launcher.REPO_ROOT / "scripts" / "launch_triton.py"), "--model-repo", str(repo),
           "--model-dir", smollm2_dir, "--http-port", str(http), "--grpc-port", str(grpc),
           "--metrics-port", str(metrics), "--log-file", str(tmp_path / "tritonserver.log")]
    proc = subprocess.Popen(cmd, env=dict(os.environ, OPENAI_PORT="0"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        server_pid, stubs = None, {}
        deadline = time.monotonic() + 120
        while not stubs:
            assert time.monotonic() < deadline, "no stub started within 120 s"
            assert proc.poll() is None, proc.stdout.read()
            for pid in procs.children(proc.pid):  # the launcher's child: tritonserver
                for stub in procs.children(pid):
                    region = procs.stub_region(stub)
                    if region and Path(region).exists():
                        server_pid, stubs[stub] = pid, region
            time.sleep(0.05)
        time.sleep(0.5)  # a few of the launcher's polls see the stub
        os.kill(server_pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode != 0, out
        assert "ready in" not in out, "the server was ready before the crash could be simulated\n" + out
        assert "tritonserver ended before it was ready" in out, out  # the one line that says where to look
        for pid, region in stubs.items():
            assert not Path(region).exists(), f"{region} left in /dev/shm\n{out}"
            assert procs.proc_stat(pid) is None, f"stub {pid} still alive\n{out}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
