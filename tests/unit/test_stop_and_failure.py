"""`stop` by request id (paddle_llm_triton/llm/stop_requests.py, control_bus.py) and the engine-failure
path (paddle_llm_engine/engine_loop.py, paddle_llm_triton/lifecycle/fault_injection.py), without a Triton server."""

from __future__ import annotations

import threading
import time
import types
import uuid

import pytest

from paddle_llm_engine.engine_loop import EngineLoop
from paddle_llm_engine.errors import EngineDeadError
from paddle_llm_engine.outputs import EngineStats, RequestOutput
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_triton.engine_channel.control_bus import ControlBus, ask, bound_instances
from paddle_llm_triton.llm.stop_requests import StopRequests
from paddle_llm_triton.lifecycle.fault_injection import InjectedFault, install_step_fault
from paddle_llm_triton.llm.stop_requests import StopRegistry, StopRequests


def wait_until(pred, timeout=5.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("condition not met")
        time.sleep(0.01)


# -- registry and bus --------------------------------------------------------------------------------

def test_registry_stops_every_request_under_the_id_and_forgets_finished_ones():
    aborted = []
    reg = StopRegistry(aborted.append)
    reg.add("client-1", "e1")
    reg.add("client-1", "e2")
    reg.add("client-2", "e3")
    reg.add("", "e4")  # no Triton id: never stoppable by id
    assert len(reg) == 3
    reg.remove("e2")  # finished
    assert reg.stop("client-1") == 1 and aborted == ["e1"]
    assert reg.stop("nobody") == 0
    reg.remove("e1")
    reg.remove("e3")
    assert len(reg) == 0 and reg.stop("client-1") == 0


def test_control_bus_forwards_stops_to_sibling_instances():
    scope_pid = 10_000_000 + uuid.uuid4().int % 1_000_000  # a fake server pid: no clash with real stubs
    aborted = {"a": [], "b": []}
    names = ["m_0_0", "m_0_1"]
    buses, stops = {}, {}
    for key, name in (("a", "m_0_0"), ("b", "m_0_1")):
        handlers = {}
        buses[key] = ControlBus("m", name, handlers, names, server_pid=scope_pid)
        stops[key] = StopRequests(aborted[key].append, buses[key].publish)
        handlers["stop"] = stops[key].on_control
        buses[key].handlers.update(handlers)
    try:
        assert buses["a"].listening and buses["b"].listening
        assert sorted(bound_instances(scope_pid)) == [("m", "m_0_0"), ("m", "m_0_1")]
        stops["b"].add("client-1", "engine-b1")
        stops["a"].add("client-2", "engine-a2")
        assert stops["a"].stop("client-1") == 0  # not here: forwarded to the sibling, which runs it
        wait_until(lambda: aborted["b"] == ["engine-b1"])
        assert stops["b"].stop("client-2") == 0
        wait_until(lambda: aborted["a"] == ["engine-a2"])
        assert aborted == {"a": ["engine-a2"], "b": ["engine-b1"]}  # nobody hears itself
    finally:
        for bus in buses.values():
            bus.close()
    # a sibling that is gone is skipped
    c = ControlBus("m", "m_0_0", {}, names, server_pid=scope_pid)
    try:
        assert c.publish({"type": "stop", "id": "x"}) == 0
    finally:
        c.close()


def test_control_bus_answers_the_launchers_questions():
    scope_pid = 10_000_000 + uuid.uuid4().int % 1_000_000
    seen = []

    def status(msg):
        seen.append(msg)
        return {"type": "status", "model": "m", "instance": "m_0_0", "in_flight": 3}

    bus = ControlBus("m", "m_0_0", {"status": status}, server_pid=scope_pid)
    try:
        replies = ask(scope_pid, [("m", "m_0_0"), ("m", "m_0_9")], {"type": "status"}, timeout=1.0)
        assert replies == {("m", "m_0_0"): {"type": "status", "model": "m", "instance": "m_0_0", "in_flight": 3}}
        assert seen == [{"type": "status"}]
    finally:
        bus.close()


# -- engine failure ----------------------------------------------------------------------------------

class FakeEngine:
    """The LLMEngine surface EngineLoop uses: every step emits one token per request."""

    def __init__(self):
        self.requests: dict[str, int] = {}
        self.num_steps = 0

    config = types.SimpleNamespace(max_num_waiting=128)
    num_waiting = 0
    num_free_seq_slots = 0  # a full batch: every request submitted counts as waiting

    def check_request(self, ids, params):
        return ids

    def add_prepared(self, rid, prepared, arrival_time=None, timeout_s=None):
        self.requests[rid] = 0

    def add_request(self, rid, ids, params, arrival_time=None, timeout_s=None):
        self.add_prepared(rid, self.check_request(ids, params))

    def abort_request(self, rid):
        if self.requests.pop(rid, None) is None:
            return None
        return RequestOutput(request_id=rid, finished=True, finish_reason="abort")

    def has_unfinished_requests(self):
        return bool(self.requests)

    def step(self):
        time.sleep(0.005)
        self.num_steps += 1
        return [RequestOutput(request_id=r, text="x", token_ids=[1]) for r in self.requests]

    def stats(self):
        return EngineStats(running=len(self.requests), waiting=0, kv_used_blocks=len(self.requests),
                           kv_free_blocks=10, prefix_cache_hit_ratio=0.0, num_preemptions_total=0)


def test_step_failure_fails_requests_in_flight_and_later_submits_fail_fast():
    engine = FakeEngine()
    install_step_fault(engine, after_steps=5)
    failures = []
    loop = EngineLoop(engine, on_failure=failures.append)
    outs: dict[str, list] = {"a": [], "b": []}
    done = threading.Event()

    def cb(out):
        outs[out.request_id].append(out)
        if all(v and v[-1].finished for v in outs.values()):
            done.set()

    loop.submit("a", [1, 2], SamplingParams(), cb)
    loop.submit("b", [1, 2], SamplingParams(), cb)
    assert done.wait(5), "requests in flight were not failed"
    for rid in ("a", "b"):
        last = outs[rid][-1]
        assert last.finish_reason == "error" and last.error_code == "internal"
        assert "engine failure" in last.error and "fault injected after 5 engine steps" in last.error
        assert 1 <= len(outs[rid]) - 1 <= 5  # some tokens came before the failure
    wait_until(lambda: not loop.healthy)
    assert len(failures) == 1 and "InjectedFault" in failures[0]
    with pytest.raises(EngineDeadError, match="engine failed earlier.*fault injected"):
        loop.submit("c", [1], SamplingParams(), cb)
    with pytest.raises(EngineDeadError):
        loop.raise_if_dead()


def test_fault_injection_zero_is_off():
    engine = FakeEngine()
    real = engine.step
    install_step_fault(engine, 0)
    assert engine.step == real
    install_step_fault(engine, 2)
    engine.requests["r"] = 0
    engine.step()
    engine.step()
    with pytest.raises(InjectedFault):
        engine.step()


# -- stalls, drain ---------------------------------------------------------------------------------

class HangingEngine(FakeEngine):
    """Its step blocks until `release` is set (a kernel that never returns, a lost device)."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.in_step = threading.Event()

    def step(self):
        self.in_step.set()
        self.release.wait(30)
        return super().step()


def test_a_step_that_never_returns_is_declared_failed_by_the_watchdog():
    from paddle_llm_triton.lifecycle.health import StallWatchdog

    engine = HangingEngine()
    failures = []
    loop = EngineLoop(engine, on_failure=failures.append)
    outs = []
    done = threading.Event()

    def cb(out):
        outs.append(out)
        if out.finished:
            done.set()

    loop.submit("a", [1, 2], SamplingParams(), cb)
    assert engine.in_step.wait(5)
    dog = StallWatchdog({"the engine step": lambda: loop.step_started_at}, loop.declare_failed, max_step_s=0.3,
                        poll_s=0.05)
    try:
        assert done.wait(5), "the request stuck in the hung step was not failed"
        assert outs[-1].finish_reason == "error" and "the engine step has not returned" in outs[-1].error
        assert "max_step_seconds" in outs[-1].error
        assert not loop.healthy and len(failures) == 1
        with pytest.raises(EngineDeadError, match="has not returned"):
            loop.submit("b", [1], SamplingParams(), cb)
        n = len(outs)
        engine.release.set()  # the stuck step returns after all: its outputs go nowhere
        loop._thread.join(5)
        assert not loop._thread.is_alive() and len(outs) == n
    finally:
        engine.release.set()
        dog.close()


class FailingStepEngine(HangingEngine):
    """Its step blocks until `release`, then raises (a tensor-parallel rank killed mid-step)."""

    def step(self):
        self.in_step.set()
        self.release.wait(30)
        raise RuntimeError("rank 1 died")


def _collect():
    outs: dict[str, list] = {}
    lock = threading.Lock()

    def cb(out):
        with lock:
            outs.setdefault(out.request_id, []).append(out)
    return outs, cb


def test_requests_queued_behind_a_failing_step_get_its_error_too():
    engine = FailingStepEngine()
    loop = EngineLoop(engine)
    outs, cb = _collect()
    loop.submit("running", [1, 2], SamplingParams(), cb)
    assert engine.in_step.wait(5)
    loop.submit("queued-1", [3], SamplingParams(), cb)  # not yet applied: the step is in progress
    loop.submit("queued-2", [4, 5], SamplingParams(), cb)
    assert loop.num_waiting == 2
    engine.release.set()
    wait_until(lambda: len(outs) == 3)
    for rid in ("running", "queued-1", "queued-2"):
        last = outs[rid][-1]
        assert last.finished and last.finish_reason == "error" and "rank 1 died" in last.error, rid
    assert outs["queued-2"][-1].num_prompt_tokens == 2
    assert loop.num_waiting == 0
    with pytest.raises(EngineDeadError, match="rank 1 died"):
        loop.submit("late", [1], SamplingParams(), cb)


def _one_running_one_queued():
    """A loop whose step hangs with request "running" in it and "queued" submitted behind it."""
    engine = HangingEngine()
    loop = EngineLoop(engine)
    outs, cb = _collect()
    loop.submit("running", [1, 2], SamplingParams(), cb)
    assert engine.in_step.wait(5)
    loop.submit("queued", [3], SamplingParams(), cb)
    return engine, loop, outs, cb


def test_requests_queued_behind_a_stuck_step_are_failed_by_the_watchdog():
    engine, loop, outs, cb = _one_running_one_queued()
    try:
        assert loop.declare_failed("the engine step has not returned for 121 s")
        assert [o.finish_reason for o in outs["queued"]] == ["error"]
        assert "has not returned" in outs["queued"][0].error
        assert [o.finish_reason for o in outs["running"]] == ["error"]
    finally:
        engine.release.set()


def test_shutdown_answers_every_request_in_flight_and_queued():
    engine, loop, outs, cb = _one_running_one_queued()
    engine.release.set()  # the step returns; the loop then meets "stop"
    loop.shutdown(timeout=5, message="llm instance llm_0_0 was unloaded before the request finished")
    for rid in ("running", "queued"):
        last = outs[rid][-1]
        assert last.finished and last.error_code == "unavailable" and "was unloaded" in last.error, rid
    assert sum(o.finished for v in outs.values() for o in v) == 2  # one final output each
    with pytest.raises(EngineDeadError, match="stopped"):
        loop.submit("late", [1], SamplingParams(), cb)


def test_watchdog_is_quiet_while_nothing_runs_and_off_at_zero():
    from paddle_llm_triton.lifecycle.health import StallWatchdog

    fired = []
    dog = StallWatchdog({"x": lambda: None}, lambda r: fired.append(r) or True, max_step_s=0.01)
    assert dog.check() is None and fired == []
    dog.close()
    off = StallWatchdog({"x": lambda: 0.0}, lambda r: fired.append(r) or True, max_step_s=0)
    assert off._thread is None
    assert StallWatchdog({"send": lambda: 100.0}, lambda r: fired.append(r) or True, max_step_s=5).check(now=106.0)
    assert "send has not returned for 6 s" in fired[0]


def test_fail_all_ends_every_request_with_the_error_and_keeps_serving():
    engine = FakeEngine()
    loop = EngineLoop(engine)
    outs: dict[str, list] = {}
    done = threading.Event()

    def cb(out):
        outs.setdefault(out.request_id, []).append(out)
        if out.finished and len([v for v in outs.values() if v[-1].finished]) == 2:
            done.set()

    try:
        loop.submit("a", [1], SamplingParams(), cb)
        loop.submit("b", [1], SamplingParams(), cb)
        wait_until(lambda: len(engine.requests) == 2)
        loop.fail_all("the server shut down before the request finished (drain grace period 1 s)")
        assert done.wait(5)
        for rid in ("a", "b"):
            last = outs[rid][-1]
            assert last.finish_reason == "error" and last.error_code == "unavailable"
            assert "drain grace period" in last.error
        assert engine.requests == {} and loop.healthy and loop.num_in_flight == 0
        got = threading.Event()
        loop.submit("c", [1], SamplingParams(), lambda out: got.set())
        assert got.wait(5)
    finally:
        loop.shutdown(2)


def test_drain_refuses_new_requests_and_ends_the_rest_at_the_deadline():
    from paddle_llm_triton.lifecycle.drain import Drain, DrainingError

    in_flight = [2]
    ended = []
    d = Drain("llm", "llm_0_0", lambda: in_flight[0], ended.append)
    d.refuse_if_draining()  # not draining: nothing happens
    assert d.on_drain({"type": "drain", "grace_s": 0.3}) == {
        "type": "status", "model": "llm", "instance": "llm_0_0", "draining": True, "in_flight": 2, "open_responses": {}}
    with pytest.raises(DrainingError, match="shutting down and takes no new requests"):
        d.refuse_if_draining()
    wait_until(lambda: ended)
    assert ended[0] == "the server shut down before the request finished (drain grace period 0 s)"
    quick = Drain("llm", "llm_0_1", lambda: in_flight[0], ended.append)
    in_flight[0] = 1
    quick.start(5)
    in_flight[0] = 0  # everything finished within the grace period: nothing is ended
    time.sleep(0.2)
    assert len(ended) == 1 and quick.status()["in_flight"] == 0


def test_sender_ledger_counts_senders_until_their_final():
    from paddle_llm_triton.lifecycle.senders import SenderLedger

    class Raw:
        def __init__(self, fail=False):
            self.sent, self.fail = [], fail

        def send(self, response=None, flags=0):
            if self.fail:
                raise RuntimeError("An error occurred while sending a response.")
            self.sent.append(flags)

        def is_cancelled(self):
            return False

    ledger = SenderLedger()
    a, b, c = ledger.track(Raw(), "llm"), ledger.track(Raw(), "llm"), ledger.track(Raw(fail=True), "stop")
    assert ledger.open == 3 and ledger.open_by_kind() == {"llm": 2, "stop": 1}
    a.send("x", flags=0)
    assert ledger.open == 3  # not final yet
    a.send(None, flags=1)
    with pytest.raises(RuntimeError):
        c.send(None, flags=1)  # a FINAL that raised still closes the sender in the stub
    assert ledger.open_by_kind() == {"llm": 1} and not b.is_cancelled()
