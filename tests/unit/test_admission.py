"""Admission limit max_num_waiting: EngineLoop.submit refuses at once in the caller's thread (even
while a step runs) with a message naming the limit; the engine's own check stays as a backstop;
nothing already queued is lost; the deprecated name max_waiting_requests still works."""

from __future__ import annotations

import logging
import threading
import time
import types

import pytest

from paddle_llm_engine import LLM, EngineBusyError, EngineConfig, EngineLoop, InvalidRequestError, ModelConfig
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
    eng = make_engine(tiny_model_dir, max_num_waiting=2)
    eng.add_request("a", prompt(5, 1), greedy(3))
    eng.add_request("b", prompt(6, 2), greedy(3))
    with pytest.raises(EngineBusyError) as e:
        eng.add_request("c", prompt(7, 3), greedy(3))
    assert str(e.value) == "server busy: 2 requests waiting (max_num_waiting 2); retry later"
    assert (e.value.waiting, e.value.limit) == (2, 2)
    assert "c" not in eng.requests
    assert drain(eng) == {"a": 3, "b": 3}  # the queued ones are not lost
    eng.add_request("c", prompt(7, 3), greedy(3))  # room again
    assert drain(eng) == {"c": 3}


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


def test_submit_refuses_at_once_while_a_step_runs(tiny_model_dir):
    eng = make_engine(tiny_model_dir, max_num_waiting=2, max_num_seqs=1)
    gate = _GatedStep(eng)
    loop = EngineLoop(eng)
    done, all_done = {}, threading.Event()

    def cb(out):
        if out.finished:
            done[out.request_id] = out
            if len(done) == 3:
                all_done.set()

    try:
        loop.submit("r0", prompt(10, 0), greedy(4), cb)
        assert gate.entered.wait(60)  # the engine thread is inside a step that does not return
        assert loop.num_waiting == 1  # r0: applied, not yet scheduled
        loop.submit("r1", prompt(10, 1), greedy(4), cb)
        assert loop.num_waiting == 2
        with pytest.raises(EngineBusyError) as e:  # answered in this thread: the step is still held
            loop.submit("r2", prompt(10, 2), greedy(4), cb)
        assert str(e.value) == "server busy: 2 requests waiting (max_num_waiting 2); retry later"
        assert not gate.release.is_set() and loop.num_waiting == 2
        gate.release.set()
        # once the queue moves (r0 running, r1 waiting), new requests are admitted again
        assert wait_until(lambda: loop.num_waiting < 2, 60)
        loop.submit("r3", prompt(10, 3), greedy(4), cb)
        assert all_done.wait(120)
    finally:
        gate.release.set()
        loop.shutdown()
    assert sorted(done) == ["r0", "r1", "r3"]
    assert all(o.finish_reason == "length" and o.num_output_tokens == 4 for o in done.values())
    assert loop.num_waiting == 0
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


class _BusyEngine:
    """The LLMEngine surface EngineLoop uses, whose add_request always hits the backstop."""

    config = types.SimpleNamespace(max_num_waiting=5)
    num_waiting = 0
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
    assert ei.value.field == "text_input"
    assert str(ei.value).startswith("text_input: the prompt has 200 tokens, more than max_model_len 128")


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
