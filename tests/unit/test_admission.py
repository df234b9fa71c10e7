"""Bounded waiting queue: past max_waiting_requests a new request is refused with a clear
"server busy" error (EngineBusyError -> Triton UNAVAILABLE) and nothing already queued is lost."""

from __future__ import annotations

import threading

import pytest

from paddle_llm_engine import EngineBusyError, EngineLoop
from test_engine_tiny import greedy, make_engine, prompt


def test_queue_bound_refuses_then_recovers(tiny_model_dir):
    eng = make_engine(tiny_model_dir, max_waiting_requests=2)
    eng.add_request("a", prompt(5, 1), greedy(3))
    eng.add_request("b", prompt(6, 2), greedy(3))
    with pytest.raises(EngineBusyError, match="server busy: 2 requests already waiting"):
        eng.add_request("c", prompt(7, 3), greedy(3))
    assert "c" not in eng.requests
    finished = drain(eng)  # the queued ones are not lost
    assert finished == {"a": 3, "b": 3}
    eng.add_request("c", prompt(7, 3), greedy(3))  # room again
    assert drain(eng) == {"c": 3}


def drain(eng) -> dict[str, int]:
    """Step to completion; {request id: output tokens} of the finished requests."""
    out = {}
    for _ in range(1000):
        if not eng.has_unfinished_requests():
            break
        for o in eng.step():
            if o.finished:
                out[o.request_id] = o.num_output_tokens
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    return out


def test_engine_loop_reports_busy_as_unavailable(tiny_model_dir):
    eng = make_engine(tiny_model_dir, max_waiting_requests=1, max_num_seqs=1, max_num_batched_tokens=16)
    loop = EngineLoop(eng)
    done = {}
    ev = threading.Event()

    def cb(out):
        if out.finished:
            done[out.request_id] = out
            if len(done) == 3:
                ev.set()

    try:
        for i in range(3):
            loop.submit(f"r{i}", prompt(40, i), greedy(4), cb)
        assert ev.wait(60)
    finally:
        loop.shutdown()
    busy = [o for o in done.values() if o.finish_reason == "error"]
    ok = [o for o in done.values() if o.finish_reason == "length"]
    assert busy and all(o.error_code == "unavailable" and "server busy" in o.error for o in busy)
    assert ok and all(o.num_output_tokens == 4 for o in ok)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
