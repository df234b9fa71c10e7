"""The drain's accept window (paddle_llm_launcher/shutdown.py, DRAIN_ACCEPT_S): readiness turns false first and the
stubs are told to refuse only after the window, so a load balancer still routing here until its next
failed health check gets its requests served; without a window (the default) the order stays the
issue-14 contract: refusals start, then readiness turns false, at once."""

from __future__ import annotations

import time

import pytest

from paddle_llm_launcher import shutdown


class FakeGate:
    def __init__(self, events):
        self.events = events

    def close(self):
        self.events.append(("gate_close", time.monotonic()))

    def shut(self):
        self.events.append(("gate_shut", time.monotonic()))


class FakeServer:
    pid = 4242
    http_port = 1
    admin_headers = {"paddle-llm-admin-key": "k" * 32}

    def __init__(self, events):
        self.gate = FakeGate(events)

    def repository(self):
        return FakeRepo(self.http_port, headers=self.admin_headers)


class FakeRepo:
    def __init__(self, _port, headers=None):
        assert headers == FakeServer.admin_headers  # the drain's unloads pass the restricted API

    def index(self):
        return {}  # nothing loaded: the unload step has nothing to wait for

    def unload(self, _model):
        raise AssertionError("nothing to unload")


@pytest.fixture
def rig(monkeypatch):
    events: list = []

    def ask(pid, targets, msg, timeout=2.0):
        events.append((msg["type"], time.monotonic()))
        return {t: {"in_flight": 0} for t in targets}

    monkeypatch.setattr(shutdown.control_bus, "bound_instances", lambda pid: [("llm", "llm_0_0")])
    monkeypatch.setattr(shutdown.control_bus, "ask", ask)
    return events


def _first(events, kind):
    return next(t for k, t in events if k == kind)


def test_without_a_window_refusals_start_before_readiness_turns_false(rig):
    summary = shutdown.drain(FakeServer(rig), 30.0, log=lambda line: None)
    kinds = [k for k, _ in rig]
    assert kinds.index("drain") < kinds.index("gate_close"), kinds
    assert kinds.count("gate_close") == 1
    assert summary["accept_s"] == 0.0 and summary["left"] == 0


def test_with_a_window_readiness_turns_false_first_and_refusals_wait_for_the_window(rig):
    lines: list[str] = []
    summary = shutdown.drain(FakeServer(rig), 30.0, log=lines.append, accept_s=0.3)
    kinds = [k for k, _ in rig]
    assert kinds.index("gate_close") < kinds.index("drain"), kinds
    assert kinds.count("gate_close") == 1  # not closed a second time after the window
    assert _first(rig, "drain") - _first(rig, "gate_close") >= 0.3
    assert summary["accept_s"] == 0.3 and summary["seconds"] >= 0.3
    assert any("still served for 0.3 s (DRAIN_ACCEPT_S)" in line for line in lines), lines


@pytest.mark.parametrize("raw, expected", [(None, 0.0), ("", 0.0), (" 5 ", 5.0), ("0", 0.0), ("2.5", 2.5)])
def test_accept_seconds_reads_the_variable(raw, expected):
    env = {} if raw is None else {"DRAIN_ACCEPT_S": raw}
    assert shutdown.accept_seconds(env) == expected


@pytest.mark.parametrize("raw", ["-1", "abc", "nan", "inf"])
def test_a_bad_accept_window_is_refused_naming_the_variable(raw):
    with pytest.raises(ValueError, match=r"DRAIN_ACCEPT_S must be a finite number of seconds >= 0"):
        shutdown.accept_seconds({"DRAIN_ACCEPT_S": raw})


def test_start_server_reads_the_window_at_start(monkeypatch, tmp_path):
    """A bad value fails when the server starts (before anything is spawned), not at its SIGTERM."""
    import paddle_llm_launcher as launcher

    monkeypatch.setenv("DRAIN_ACCEPT_S", "soon")
    backend = tmp_path / "backends"
    (backend / "python").mkdir(parents=True)
    (backend / "python" / "triton_python_backend_stub").write_text("")
    with pytest.raises(ValueError, match="DRAIN_ACCEPT_S"):
        launcher.start_server(tmp_path, 1, 2, 3, backend_dir=backend, supervise=True)
