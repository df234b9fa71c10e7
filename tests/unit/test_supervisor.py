"""The launcher's supervisor (paddle_llm_launcher/supervisor.py) against fakes of what it
watches and drives: "stub" processes (sleep, exec'd under the stub's name with a stub's argv) as
children of this process, a fake Triton repository API and metrics endpoint over HTTP, a recording
readiness gate. Checked: a dead stub -> unload + load of its model, gate closed then opened, restart
count written; a model Triton cannot unload -> a server restart; an unhealthy gauge or a failure
notice -> a reload; a stale scrape from before a reload does not reload again; the parsers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from paddle_llm_launcher.repository import RepositoryClient
from paddle_llm_launcher.supervisor import Supervisor, stub_identity, unhealthy_instances
from paddle_llm_triton.lifecycle.restarts import notify_failure, restart_count


ADMIN = {"paddle-llm-admin-key": "k" * 32}  # the launcher's admin header (admin_api.py)


class FakeTriton:
    """/v2/repository/index|models/<m>/load|unload and /metrics. `stuck` models never unload. The
    repository API is restricted as the launcher starts Triton: 403 without the admin header (counted
    in `refused`)."""

    def __init__(self, models):
        self.state = {m: "READY" for m in models}
        self.refused = 0
        self.calls: list[tuple[str, str]] = []
        self.stuck: set[str] = set()
        self.metrics = ""
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, code, body=b""):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._reply(200, outer.metrics.encode())

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                self.rfile.read(n)
                if all(self.headers.get(k) != v for k, v in ADMIN.items()):
                    outer.refused += 1
                    return self._reply(403, b'{"error":"This API is restricted"}')
                parts = self.path.strip("/").split("/")
                if self.path.endswith("/index"):
                    return self._reply(200, json.dumps([{"name": m, "state": s} for m, s in outer.state.items()]).encode())
                model, action = parts[3], parts[4]
                outer.calls.append((action, model))
                if action == "unload":
                    outer.state[model] = "UNLOADING" if model in outer.stuck else "UNAVAILABLE"
                else:
                    outer.state[model] = "READY"
                self._reply(200)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


class FakeGate:
    def __init__(self):
        self.log: list[str] = []

    def close(self):
        self.log.append("close")

    def open(self, log=print):
        self.log.append("open")
        return True


class FakeServer:
    """What the supervisor reads of a TritonServer: pid (stubs are its children), ports, proc."""

    def __init__(self, triton: FakeTriton):
        self.pid = os.getpid()
        self.http_port = triton.port
        self.admin_headers = dict(ADMIN)
        self.metrics_url = f"http://127.0.0.1:{triton.port}/metrics"
        self.proc = subprocess.Popen(["sleep", "600"])  # "running"
        self.restarted = threading.Event()

    def repository(self):
        # the fake answers the repository API over HTTP only (the real handle loads over gRPC)
        return RepositoryClient(self.http_port, headers=self.admin_headers)

    def restart(self):
        if self.proc.poll() is not None:
            self.proc = subprocess.Popen(["sleep", "600"])  # "started again"
        self.restarted.set()

    def remember_stubs(self):
        pass

    def wait_ready(self, timeout):
        return 0.0


def spawn_stub(tmp: Path, model: str, instance: str) -> subprocess.Popen:
    """A process whose argv is a Python-backend stub's: `triton_python_backend_stub <repo>/<model>/1/model.py
    <region> ... <instance> DEFAULT` (the name links to this Python, the model.py sleeps)."""
    exe = tmp / "triton_python_backend_stub"
    if not exe.exists():
        exe.symlink_to(sys.executable)
    script = tmp / "repo" / model / "1" / "model.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("import time\ntime.sleep(600)\n")
    return subprocess.Popen([str(exe), str(script), "triton_python_backend_shm_region_x", "1", "1", "1", "/b",
                             "336", instance, "DEFAULT"])


@pytest.fixture
def rig(tmp_path, monkeypatch):
    triton = FakeTriton(["llm", "ensemble"])
    server = FakeServer(triton)
    stubs = {("llm", "llm_0_0"): spawn_stub(tmp_path, "llm", "llm_0_0"),
             ("ensemble", "ensemble_0_0"): spawn_stub(tmp_path, "ensemble", "ensemble_0_0")}
    time.sleep(0.2)
    gate = FakeGate()
    lines: list[str] = []
    sup = Supervisor(server, tmp_path / "state", gate=gate, poll_s=0.05, metrics_every_s=0.1,
                     unload_timeout_s=0.5, log=lines.append)
    monkeypatch.setenv("PADDLE_LLM_SUPERVISOR_STATE", str(tmp_path / "state"))
    yield triton, server, stubs, gate, sup, lines
    sup.stop()
    for p in stubs.values():
        p.kill()
    server.proc.kill()
    triton.close()


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.02)
    return pred()


def test_parsers():
    text = ('llm_engine_healthy{instance="llm_0_0",model="llm",version="1"} 1\n'
            'llm_engine_healthy{instance="llm_0_1",model="llm",version="1"} 0\n'
            'llm_engine_healthyish{instance="x",model="y"} 0\n')
    assert unhealthy_instances(text) == [("llm", "llm_0_1")]
    assert stub_identity(os.getpid()) is None  # not a stub


def test_a_dead_stub_is_reloaded_behind_a_closed_gate(rig):
    triton, server, stubs, gate, sup, lines = rig
    assert stub_identity(stubs[("llm", "llm_0_0")].pid) == ("llm", "llm_0_0")
    sup.start()
    time.sleep(0.2)
    assert triton.calls == [] and gate.log == []  # all alive: nothing happens
    stubs[("llm", "llm_0_0")].kill()
    stubs[("llm", "llm_0_0")].wait()
    assert wait_for(lambda: ("load", "llm") in triton.calls)
    assert triton.calls[:2] == [("unload", "llm"), ("load", "llm")]
    assert triton.refused == 0  # every repository call carried the admin header
    assert wait_for(lambda: gate.log == ["close", "open"])
    assert restart_count("llm") == 1 and restart_count("ensemble") == 0
    assert any("stub llm_0_0" in l and "exited" in l for l in lines), lines
    assert [e.kind for e in sup.events] == ["died", "reloaded"]


def test_a_model_triton_cannot_unload_restarts_the_server(rig):
    triton, server, stubs, gate, sup, lines = rig
    triton.stuck.add("llm")  # requests of the dead stub never released: Triton 2.51's case
    sup.start()
    time.sleep(0.2)
    stubs[("llm", "llm_0_0")].kill()
    assert server.restarted.wait(10)
    assert ("load", "llm") not in triton.calls
    assert wait_for(lambda: any(e.kind == "server_restarted" for e in sup.events))
    assert any("restarting tritonserver" in l for l in lines), lines


def test_unhealthy_gauge_and_failure_notice_both_reload(rig):
    triton, server, stubs, gate, sup, lines = rig
    sup.start()
    triton.metrics = 'llm_engine_healthy{instance="llm_0_0",model="llm",version="1"} 0\n'
    assert wait_for(lambda: ("load", "llm") in triton.calls)
    triton.metrics = 'llm_engine_healthy{instance="llm_0_0",model="llm",version="1"} 1\n'
    assert wait_for(lambda: not sup.busy)
    time.sleep(0.5)  # scrapes after the reload see the healthy instance: no second reload
    assert triton.calls.count(("load", "llm")) == 1
    assert notify_failure("ensemble", "ensemble_0_0", "RuntimeError: device lost")
    assert wait_for(lambda: ("load", "ensemble") in triton.calls)
    assert any("reports an engine failure (RuntimeError: device lost)" in l for l in lines), lines


def test_a_scrape_older_than_the_last_reload_is_ignored(rig):
    triton, server, stubs, gate, sup, lines = rig
    sup._reloaded_at["llm"] = time.monotonic()
    sup._on_failure("llm", "unhealthy", "stale", observed_at=time.monotonic() - 1.0)
    assert sup.events == [] and not sup.busy
    sup._on_failure("llm", "unhealthy", "fresh", observed_at=time.monotonic())
    assert [e.detail for e in sup.events] == ["fresh"]
    assert wait_for(lambda: not sup.busy)


def test_a_dead_tritonserver_is_started_again(rig):
    triton, server, stubs, gate, sup, lines = rig
    sup.start()
    time.sleep(0.2)
    old = server.proc
    old.kill()  # as when Triton 2.51's Python backend aborts the server
    old.wait()
    assert server.restarted.wait(10)
    assert server.proc is not old and server.proc.poll() is None
    assert wait_for(lambda: any(e.kind == "server_restarted" for e in sup.events))
    assert any("tritonserver exited with code -9; restarting tritonserver" in l for l in lines), lines
    assert ("load", "llm") not in triton.calls  # a restart loads everything: no per-model reload


def test_a_live_stub_gets_time_to_finish_before_anything_is_killed(rig):
    triton, server, stubs, gate, sup, lines = rig
    sup.unload_timeout_s = 0.2
    triton.stuck.add("llm")  # finalize() still running: stays UNLOADING for a while
    sup.start()
    assert notify_failure("llm", "llm_0_0", "WorkerFailure: rank 1 died")
    assert wait_for(lambda: ("unload", "llm") in triton.calls)
    time.sleep(1.0)
    assert not server.restarted.is_set() and stubs[("llm", "llm_0_0")].poll() is None  # not 0.2 s: FINALIZE_GRACE_S
    triton.stuck.discard("llm")
    triton.state["llm"] = "UNAVAILABLE"
    assert wait_for(lambda: ("load", "llm") in triton.calls)
    assert not server.restarted.is_set()


def test_a_drain_that_lost_nothing_is_clean_whatever_tritonserver_exits_with():
    from paddle_llm_launcher.shutdown import clean_despite_exit_code

    clean = {"left": 0, "open_responses": {}, "stuck": ["ensemble"]}
    assert clean_despite_exit_code(clean, 1, killed=False)
    # killed after its exit timeout because a client's open gRPC stream held a model: nothing lost
    assert clean_despite_exit_code({**clean, "stuck": ["llm"]}, -9, killed=True)
    # a request still in flight, a response without its FINAL, a killed server with nothing stuck, no drain
    assert not clean_despite_exit_code({**clean, "left": 2}, 1, killed=False)
    assert not clean_despite_exit_code({**clean, "open_responses": {"llm/llm_0_0": {"llm": 1}}}, 1, killed=False)
    assert not clean_despite_exit_code({**clean, "left": 1}, -9, killed=True)
    assert not clean_despite_exit_code({**clean, "stuck": []}, -9, killed=True)
    assert not clean_despite_exit_code(clean, 0, killed=False)
    assert not clean_despite_exit_code(None, 1, killed=False)
    # exit 1 with every model unloaded is some other failure of tritonserver's
    assert not clean_despite_exit_code({**clean, "stuck": []}, 1, killed=False)


def test_a_model_loaded_later_by_an_operator_is_not_supervised(tmp_path, monkeypatch):
    """Only the served repository's models are reloaded: a model an operator loaded through the
    repository API (its files maybe only in that request) and unloaded again is left alone, while a
    repository model's dead stub still is reloaded."""
    triton = FakeTriton(["llm", "probe"])
    server = FakeServer(triton)
    stubs = {m: spawn_stub(tmp_path, m, f"{m}_0_0") for m in ("llm", "probe")}
    time.sleep(0.2)
    gate = FakeGate()
    sup = Supervisor(server, tmp_path / "state", gate=gate, poll_s=0.05, metrics_every_s=0.1,
                     unload_timeout_s=0.5, log=lambda line: None, models=("llm",))
    monkeypatch.setenv("PADDLE_LLM_SUPERVISOR_STATE", str(tmp_path / "state"))
    try:
        sup.start()
        time.sleep(0.2)
        stubs["probe"].kill()
        stubs["probe"].wait()
        time.sleep(0.5)  # ten polls
        assert triton.calls == [] and gate.log == []
        stubs["llm"].kill()
        stubs["llm"].wait()
        assert wait_for(lambda: ("load", "llm") in triton.calls)
        assert all(model == "llm" for _, model in triton.calls), triton.calls
    finally:
        sup.stop()
        for p in stubs.values():
            p.kill()
        server.proc.kill()
        triton.close()
