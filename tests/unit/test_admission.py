"""Admission limit max_num_waiting: EngineLoop.submit refuses at once in the caller's thread (even
while a step runs) with a message naming the limit; the engine's own check stays as a backstop;
nothing already queued is lost; the deprecated name max_waiting_requests still works."""

from __future__ import annotations

import logging
import threading
import time
import types

import pytest

from paddle_llm_engine import (LLM, EngineBusyError, EngineConfig, EngineLoop, ErrorCode, InvalidRequestError,
                               ModelConfig)
from paddle_llm_engine.outputs import EngineStats
from test_engine_tiny import greedy, make_engine, prompt


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


def test_engine_backstop_refuses_then_recovers(tiny_model_dir):
    eng = make_engine(tiny_model_dir, max_num_waiting=2, max_num_seqs=1)
    eng.add_request("a", prompt(5, 1), greedy(3))  # takes the one running slot at the next step
    eng.add_request("b", prompt(6, 2), greedy(3))
    eng.add_request("c", prompt(7, 4), greedy(3))
    assert (eng.num_waiting, eng.num_free_seq_slots, eng.num_backlog) == (3, 1, 2)
    with pytest.raises(EngineBusyError) as e:
        eng.add_request("d", prompt(7, 3), greedy(3))
    assert str(e.value) == "server busy: 2 requests waiting (max_num_waiting 2); retry later"
    assert (e.value.waiting, e.value.limit) == (2, 2)
    assert "d" not in eng.requests
    assert drain(eng) == {"a": 3, "b": 3, "c": 3}  # the queued ones are not lost
    eng.add_request("d", prompt(7, 3), greedy(3))  # room again
    assert drain(eng) == {"d": 3}


def test_engine_backstop_counts_only_what_the_free_slots_cannot_take(tiny_model_dir):
    """max_num_seqs 4, max_num_waiting 2: six requests added before a step fit (four are about to
    run), the seventh is refused; one step later four run and two wait."""
    eng = make_engine(tiny_model_dir, max_num_waiting=2, max_num_seqs=4)
    for i in range(6):
        eng.add_request(f"r{i}", prompt(5 + i, i), greedy(3))
    assert (eng.num_waiting, eng.num_backlog) == (6, 2)
    with pytest.raises(EngineBusyError, match="server busy: 2 requests waiting"):
        eng.add_request("r6", prompt(5, 9), greedy(3))
    eng.step()
    assert (len(eng.scheduler.running), eng.num_waiting, eng.num_backlog) == (4, 2, 2)
    assert drain(eng) == {f"r{i}": 3 for i in range(6)}


def wait_until(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class _GatedStep:
    """Wraps engine.step: each call waits until `release` is set (a step that takes long)."""

    def __init__(self, eng):
        self.real = eng.step
        self.entered = threading.Event()
        self.release = threading.Event()
        eng.step = self

    def __call__(self, *a, **kw):
        self.entered.set()
        assert self.release.wait(120), "test never released the step"
        return self.real(*a, **kw)


def _collector(n: int):
    done, all_done = {}, threading.Event()

    def cb(out):
        if out.finished:
            done[out.request_id] = out
            if len(done) == n:
                all_done.set()
    return done, all_done, cb


def test_submit_refuses_at_once_while_a_step_runs(tiny_model_dir):
    eng = make_engine(tiny_model_dir, max_num_waiting=2, max_num_seqs=1)
    gate = _GatedStep(eng)
    loop = EngineLoop(eng)
    done, all_done, cb = _collector(4)
    try:
        loop.submit("r0", prompt(10, 0), greedy(4), cb)
        assert gate.entered.wait(60)  # the engine thread is inside a step that does not return
        assert loop.num_waiting == 0  # r0: applied, not yet scheduled, and the one slot is free for it
        loop.submit("r1", prompt(10, 1), greedy(4), cb)
        loop.submit("r2", prompt(10, 2), greedy(4), cb)
        assert loop.num_waiting == 2
        with pytest.raises(EngineBusyError) as e:  # answered in this thread: the step is still held
            loop.submit("r3", prompt(10, 3), greedy(4), cb)
        assert str(e.value) == "server busy: 2 requests waiting (max_num_waiting 2); retry later"
        assert not gate.release.is_set() and loop.num_waiting == 2
        gate.release.set()
        # once the queue moves (r1 running, r2 waiting), new requests are admitted again
        assert wait_until(lambda: loop.num_waiting < 2, 60)
        loop.submit("r4", prompt(10, 4), greedy(4), cb)
        assert all_done.wait(120)
    finally:
        gate.release.set()
        loop.shutdown()
    assert sorted(done) == ["r0", "r1", "r2", "r4"]
    assert all(o.finish_reason == "length" and o.num_output_tokens == 4 for o in done.values())
    assert loop.num_waiting == 0
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_a_burst_within_one_step_that_fits_the_free_slots_is_admitted(tiny_model_dir):
    """The soak's post-flood refusals: traffic resumed at once into an idle engine and, while the
    first request's step ran, more requests arrived than max_num_waiting, though the batch had room
    for all of them. Counted as waiting they were refused ("server busy: 8 requests waiting" with
    nothing waiting a step later); they are about to run, so they are admitted. Past the free slots
    the limit holds as before."""
    eng = make_engine(tiny_model_dir, max_num_waiting=2, max_num_seqs=6)
    gate = _GatedStep(eng)
    loop = EngineLoop(eng)
    done, all_done, cb = _collector(8)
    try:
        loop.submit("r0", prompt(8, 0), greedy(3), cb)
        assert gate.entered.wait(60)  # r0's step is held: everything below arrives during it
        for i in range(1, 8):  # six take the six slots, two wait
            loop.submit(f"r{i}", prompt(8, i), greedy(3), cb)
        assert loop.num_waiting == 2
        with pytest.raises(EngineBusyError, match=r"server busy: 2 requests waiting \(max_num_waiting 2\)"):
            loop.submit("r8", prompt(8, 8), greedy(3), cb)
        gate.release.set()
        assert all_done.wait(120)
    finally:
        gate.release.set()
        loop.shutdown()
    assert sorted(done) == [f"r{i}" for i in range(8)]
    assert all(o.finish_reason == "length" and o.num_output_tokens == 3 for o in done.values())
    assert loop.num_waiting == 0
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


class _BusyEngine:
    """The LLMEngine surface EngineLoop uses, whose add_request always hits the backstop."""

    config = types.SimpleNamespace(max_num_waiting=5)
    num_waiting = 0
    num_free_seq_slots = 0
    requests: dict = {}

    def check_request(self, ids, params):
        return ids

    def add_prepared(self, rid, prepared, arrival_time=None, timeout_s=None):
        raise EngineBusyError(5, 5)

    def abort_request(self, rid):
        return None

    def has_unfinished_requests(self):
        return False

    def step(self):
        return []

    def stats(self):
        return EngineStats(running=0, waiting=0, kv_used_blocks=0, kv_free_blocks=1, prefix_cache_hit_ratio=0.0,
                           num_preemptions_total=0)


def test_loop_reports_the_engine_backstop_as_unavailable_queue_full():
    loop = EngineLoop(_BusyEngine())
    got, ev = [], threading.Event()
    try:
        loop.submit("x", [1, 2], greedy(2), lambda out: (got.append(out), ev.set()))
        assert ev.wait(30)
    finally:
        loop.shutdown()
    (out,) = got
    assert out.finished and out.finish_reason == "error" and out.error_code == "unavailable"
    assert out.rejected == "queue_full" and "max_num_waiting 5" in out.error
    assert loop.num_waiting == 0  # the refused request left the count


def test_invalid_request_is_refused_by_submit_naming_the_field(tiny_model_dir):
    """The engine's rules run in the caller's thread (LLMEngine.check_request): submit raises at
    once, nothing is queued, the callback is never called."""
    eng = make_engine(tiny_model_dir)
    loop = EngineLoop(eng)
    got = []
    try:
        with pytest.raises(InvalidRequestError) as ei:  # over max_model_len
            loop.submit("x", prompt(200, 0), greedy(2), got.append)
        assert loop.num_waiting == 0 and loop.num_in_flight == 0
    finally:
        loop.shutdown()
    assert got == []
    assert (ei.value.field, ei.value.code) == ("prompt", ErrorCode.PROMPT_TOO_LONG)
    assert str(ei.value).startswith("prompt: the prompt has 200 tokens, more than max_model_len 128")


# -- settings ----------------------------------------------------------------------------------------

def test_default_limit_is_four_batches(tiny_model_dir):
    model = ModelConfig.from_dir(tiny_model_dir)
    cfg = EngineConfig(model_dir=tiny_model_dir)
    cfg.validate(model)
    assert (cfg.max_num_seqs, cfg.max_num_waiting) == (32, 128)
    cfg = EngineConfig(model_dir=tiny_model_dir, max_num_seqs=8)
    cfg.validate(model)
    assert cfg.max_num_waiting == 32
    cfg = EngineConfig(model_dir=tiny_model_dir, max_num_waiting=5)
    cfg.validate(model)
    assert cfg.max_num_waiting == 5
    with pytest.raises(ValueError, match="max_num_waiting must be >= 0"):
        EngineConfig(model_dir=tiny_model_dir, max_num_waiting=-1).validate(model)
    info = make_engine(tiny_model_dir, max_num_seqs=8).info()  # llm_engine_info's labels
    assert (info["max_num_seqs"], info["max_num_waiting"]) == ("8", "32")


def test_deprecated_alias_warns_and_both_names_are_an_error(tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="paddle_llm_engine.config"):
        cfg = EngineConfig(model_dir=tiny_model_dir, max_waiting_requests=7)
    assert cfg.max_num_waiting == 7
    assert "max_waiting_requests is deprecated: use max_num_waiting" in caplog.text
    with pytest.raises(ValueError, match="max_num_waiting .3. and its deprecated alias max_waiting_requests .7. "
                                         "are both set"):
        EngineConfig(model_dir=tiny_model_dir, max_num_waiting=3, max_waiting_requests=7)
    with pytest.raises(ValueError, match="max_waiting_requests must be > 0"):
        EngineConfig(model_dir=tiny_model_dir, max_waiting_requests=0)


def test_offline_llm_runs_more_prompts_than_the_admission_limit(tiny_model_dir):
    """LLM.generate is a batch job: its prompts join as the queue drains instead of failing."""
    llm = LLM(tiny_model_dir, device="cpu", block_size=16, num_kv_blocks=64, max_model_len=128, max_num_seqs=2,
              max_num_waiting=2, num_threads=2)
    prompts = [prompt(6 + i, i) for i in range(9)]
    outs = llm.generate(prompts, greedy(3))
    assert [o.finish_reason for o in outs] == ["length"] * 9 and all(len(o.token_ids) == 3 for o in outs)
    solo = make_engine(tiny_model_dir)
    solo.add_request("s", prompts[7], greedy(3))
    tokens = []
    while solo.has_unfinished_requests():
        tokens += [t for o in solo.step() for t in o.token_ids]
    assert outs[7].token_ids == tokens
