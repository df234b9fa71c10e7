"""Per-request deadlines in the engine: the caller's timeout_s and the max_request_seconds setting
(the nearer wins, from arrival). At the deadline the request is aborted wherever it is (running or
waiting), its KV blocks are freed, its final output says what happened, and the other requests in
the batch are not affected. The engine's clock is replaced by one the test moves."""

from __future__ import annotations

import threading
import time

import pytest

import paddle_llm_engine.engine as engine_mod
from paddle_llm_engine import EngineLoop
from paddle_llm_engine.engine import Deadline
from test_engine_tiny import greedy, make_engine, prompt


class Clock:
    """Stands in for the engine module's `time`: monotonic() returns `now`."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(engine_mod, "time", c)
    return c


def collect(outputs, into: dict) -> None:
    for o in outputs:
        r = into.setdefault(o.request_id, {"tokens": [], "final": None})
        r["tokens"] += o.token_ids
        if o.finished:
            r["final"] = o


def solo_tokens(model_dir, ids, n) -> list[int]:
    eng = make_engine(model_dir)
    eng.add_request("solo", ids, greedy(n))
    got = {}
    while eng.has_unfinished_requests():
        collect(eng.step(), got)
    return got["solo"]["tokens"]


def test_running_request_aborted_at_its_timeout_others_unaffected(tiny_model_dir, clock):
    eng = make_engine(tiny_model_dir)
    bm = eng.block_manager
    t0 = clock.now
    eng.add_request("late", prompt(20, 1), greedy(50), arrival_time=t0, timeout_s=2.0)
    eng.add_request("ok", prompt(24, 2), greedy(12), arrival_time=t0)
    got = {}
    for _ in range(3):  # both run and generate
        clock.now += 0.5
        collect(eng.step(), got)
    assert len(got["late"]["tokens"]) == 3 and got["late"]["final"] is None
    used_before = bm.num_used_blocks
    late_blocks = len(eng.requests["late"].seq.block_table)
    assert late_blocks > 0
    clock.now = t0 + 2.0
    outs = eng.step()
    collect(outs, got)
    final = got["late"]["final"]
    assert outs[0] is final  # aborted before the step ran
    assert final.finish_reason == "abort" and final.timed_out and final.error_code == "unavailable"
    assert final.error == "deadline exceeded: the request ran 2.0 s (timeout 2.0 s); 3 tokens generated"
    assert "late" not in eng.requests and eng.num_timed_out == 1
    # its blocks went back at once (the step's growth of "ok" is at most one block)
    assert bm.num_used_blocks <= used_before - late_blocks + 1
    while eng.has_unfinished_requests():
        clock.now += 0.5
        collect(eng.step(), got)
    assert got["ok"]["final"].finish_reason == "length" and not got["ok"]["final"].timed_out
    assert got["ok"]["tokens"] == solo_tokens(tiny_model_dir, prompt(24, 2), 12)
    assert bm.num_free_blocks == bm.num_blocks


def test_waiting_request_aborted_by_max_request_seconds(tiny_model_dir, clock):
    eng = make_engine(tiny_model_dir, max_num_seqs=1, max_request_seconds=5.0)
    t0 = clock.now
    eng.add_request("first", prompt(20, 1), greedy(30), arrival_time=t0)
    eng.add_request("queued", prompt(20, 2), greedy(30), arrival_time=t0 + 1)
    got = {}
    clock.now += 0.1
    collect(eng.step(), got)
    assert [s.request_id for s in eng.scheduler.waiting] == ["queued"]
    clock.now = t0 + 5.0  # "first" reaches max_request_seconds, "queued" (arrived 1 s later) does not
    collect(eng.step(), got)
    assert got["first"]["final"].error == ("deadline exceeded: the request ran 5.0 s (max_request_seconds 5.0 s); "
                                           "1 token generated")
    assert got.get("queued", {}).get("final") is None
    # "queued" started running in that step; now let a third one wait and expire while waiting
    eng.add_request("never", prompt(20, 3), greedy(4), arrival_time=clock.now)
    clock.now += 5.5
    outs = eng.step()
    collect(outs, got)
    assert got["queued"]["final"].timed_out
    never = got["never"]["final"]
    assert never.timed_out and never.token_ids == [] and never.num_output_tokens == 0
    assert never.error == ("deadline exceeded: the request ran 5.5 s (max_request_seconds 5.0 s); "
                           "aborted before its first token")
    assert not eng.has_unfinished_requests()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_the_nearer_deadline_wins_and_zero_means_none(tiny_model_dir, clock):
    d = Deadline.earliest(10.0, 3.0, 5.0)
    assert (d.at, d.seconds, d.source) == (13.0, 3.0, "timeout")
    d = Deadline.earliest(10.0, 8.0, 5.0)
    assert (d.at, d.source) == (15.0, "max_request_seconds")
    assert Deadline.earliest(10.0, None, 0.0) is None and Deadline.earliest(10.0, 0, 0.0) is None
    eng = make_engine(tiny_model_dir, max_request_seconds=5.0)
    eng.add_request("a", prompt(8, 1), greedy(40), arrival_time=clock.now, timeout_s=0.25)
    clock.now += 0.25
    (out,) = eng.step()
    assert out.error == "deadline exceeded: the request ran 0.25 s (timeout 0.25 s); aborted before its first token"
    with pytest.raises(ValueError, match="timeout_s must be >= 0"):
        eng.add_request("b", prompt(8, 1), greedy(4), timeout_s=-1.0)
    with pytest.raises(ValueError, match="max_request_seconds must be >= 0"):
        make_engine(tiny_model_dir, max_request_seconds=-2.0)


def test_n_sequences_all_aborted_and_their_shared_blocks_freed(tiny_model_dir, clock):
    eng = make_engine(tiny_model_dir)
    sp = greedy(40)
    sp.temperature, sp.top_k, sp.seed, sp.n = 1.0, 20, 5, 3
    eng.add_request("n3", prompt(40, 4), sp, arrival_time=clock.now, timeout_s=1.0)
    got = {}
    for _ in range(3):
        collect(eng.step(), got)
    assert len(eng.requests["n3"].states) == 3 and eng.block_manager.num_used_blocks > 0
    clock.now += 1.0
    outs = eng.step()
    assert len(outs) == 1 and outs[0].finished and outs[0].timed_out
    assert not eng.has_unfinished_requests()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_deadline_entries_of_finished_requests_do_not_pile_up(tiny_model_dir, clock):
    eng = make_engine(tiny_model_dir)
    for i in range(300):  # each ends long before its deadline
        eng.add_request(f"r{i}", prompt(4, i), greedy(1), arrival_time=clock.now, timeout_s=3600.0)
        while eng.has_unfinished_requests():
            eng.step()
    assert len(eng._deadlines) <= 64 + 2 * len(eng.requests)


def test_engine_loop_times_out_a_stream_and_frees_its_blocks(tiny_model_dir):
    """Real clock, through EngineLoop.submit: a long request with a 0.5 s timeout ends with the
    deadline error while a request without one completes."""
    eng = make_engine(tiny_model_dir)
    real_step = eng.step

    def slow_step(*a, **kw):  # 50 ms per step: the 100-token request needs about 5 s
        time.sleep(0.05)
        return real_step(*a, **kw)

    eng.step = slow_step
    loop = EngineLoop(eng)
    done, ev = {}, threading.Event()

    def cb(out):
        if out.finished:
            done[out.request_id] = out
            if len(done) == 2:
                ev.set()

    try:
        loop.submit("slow", prompt(10, 1), greedy(100), cb, timeout_s=0.5)
        loop.submit("short", prompt(10, 2), greedy(3), cb)
        assert ev.wait(120)
    finally:
        loop.shutdown()
    slow = done["slow"]
    assert slow.timed_out and slow.finish_reason == "abort" and slow.error_code == "unavailable"
    assert slow.error.startswith("deadline exceeded: the request ran ") and "(timeout 0.5 s)" in slow.error
    assert 0 < slow.num_output_tokens < 100
    assert done["short"].finish_reason == "length" and done["short"].num_output_tokens == 3
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
