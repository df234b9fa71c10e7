"""`stop` by request id (paddle_llm_triton/stop_requests.py, abort_bus.py) and the engine-failure
path (paddle_llm_engine/engine_loop.py, paddle_llm_triton/fault_injection.py), without a Triton server."""

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
from paddle_llm_triton.abort_bus import AbortBus
from paddle_llm_triton.fault_injection import InjectedFault, install_step_fault
from paddle_llm_triton.stop_requests import StopRegistry, StopRequests


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


def test_abort_bus_forwards_ids_to_sibling_instances():
    scope_pid = 10_000_000 + uuid.uuid4().int % 1_000_000  # a fake server pid: no clash with real stubs
    got = {"a": [], "b": []}
    names = ["m_0_0", "m_0_1"]
    a = AbortBus("m", "m_0_0", names, got["a"].append, server_pid=scope_pid)
    b = AbortBus("m", "m_0_1", names, got["b"].append, server_pid=scope_pid)
    try:
        assert a.listening and b.listening
        assert a.publish("req-1") == 1
        wait_until(lambda: got["b"] == ["req-1"])
        assert b.publish("req-2") == 1
        wait_until(lambda: got["a"] == ["req-2"])
        assert got["a"] == ["req-2"] and got["b"] == ["req-1"]  # nobody hears itself
    finally:
        a.close()
        b.close()
    # a sibling that is gone is skipped
    c = AbortBus("m", "m_0_0", names, lambda _id: None, server_pid=scope_pid)
    try:
        assert c.publish("req-3") == 0
    finally:
        c.close()


def test_stop_reaches_the_instance_that_runs_the_request():
    """Two instances; the stop arrives at the one that does not run the request."""
    pid = 10_000_000 + uuid.uuid4().int % 1_000_000
    names = ["llm_0_0", "llm_0_1"]
    aborted0, aborted1 = [], []
    inst0 = StopRequests(aborted0.append, "llm", "llm_0_0", names, server_pid=pid)
    inst1 = StopRequests(aborted1.append, "llm", "llm_0_1", names, server_pid=pid)
    try:
        inst1.add("triton-id-9", "engine-rid-1")
        assert inst0.stop("triton-id-9") == 0  # not here ...
        wait_until(lambda: aborted1 == ["engine-rid-1"])  # ... but aborted on the sibling
        assert aborted0 == []
    finally:
        inst0.close()
        inst1.close()


# -- engine failure ----------------------------------------------------------------------------------

class FakeEngine:
    """The LLMEngine surface EngineLoop uses: every step emits one token per request."""

    def __init__(self):
        self.requests: dict[str, int] = {}
        self.num_steps = 0

    config = types.SimpleNamespace(max_num_waiting=128)
    num_waiting = 0

    def add_request(self, rid, ids, params, arrival_time=None, timeout_s=None):
        self.requests[rid] = 0

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
