"""The priority scheduling policy (scheduler.py, EngineConfig.scheduling_policy "priority") on bare
Sequences: the waiting order, who is preempted for an urgent arrival and when not, fcfs unchanged.
With a real (tiny) model: the urgent request's first token comes in the next step and the preempted
sequences' greedy outputs equal their outputs alone."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams
from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.scheduler import Scheduler
from paddle_llm_engine.sequence import Sequence, SequenceStatus

from test_scheduler import advance

_ids = iter(range(10**9))


def seq(n_prompt: int, priority: int = 0, arrival: float | None = None, max_tokens: int = 64) -> Sequence:
    i = next(_ids)
    return Sequence(f"q{i}", [100 + (i + k) % 50 for k in range(n_prompt)],
                    SamplingParams(temperature=0.0, priority=priority), max_tokens, [2],
                    arrival_time=float(i) if arrival is None else arrival)


def sched(policy="priority", num_blocks=64, block_size=16, max_num_seqs=4, budget=256) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, budget, policy=policy)


def test_waiting_queue_is_ordered_by_priority_then_arrival():
    s = sched(max_num_seqs=1)
    a, b, c, d = seq(4, 5), seq(4, 0), seq(4, 5), seq(4, -3)
    for x in (a, b, c, d):
        s.add(x)
    assert list(s.waiting) == [d, b, a, c]
    out = s.schedule()
    assert [x.seq for x in out.scheduled] == [d]


def test_fcfs_ignores_priority():
    s = sched(policy="fcfs", max_num_seqs=1)
    a, b = seq(4, 5), seq(4, 0)
    s.add(a)
    s.add(b)
    assert list(s.waiting) == [a, b]


def test_an_urgent_arrival_takes_the_slot_of_the_least_urgent_running_sequence():
    s = sched(max_num_seqs=3)
    running = [seq(4, 5), seq(4, 7), seq(4, 5)]
    for x in running:
        s.add(x)
    advance(s, s.schedule())
    urgent = seq(4, 0)
    s.add(urgent)
    out = s.schedule()
    # the priority-7 one goes (least urgent), the urgent one runs in this very step
    assert out.preempted == [running[1]]
    assert running[1].status is SequenceStatus.WAITING and running[1].num_computed_tokens == 0
    assert urgent in [x.seq for x in out.scheduled] and urgent.status is SequenceStatus.RUNNING
    assert sorted(x.seq.request_id for x in out.scheduled) == sorted(
        x.request_id for x in (running[0], running[2], urgent))
    # the victim waits at its own place: before later arrivals of its priority, after more urgent ones
    later = seq(4, 7)
    s.add(later)
    assert list(s.waiting) == [running[1], later]


def test_no_preemption_for_an_equal_or_lower_priority_or_when_a_slot_is_free():
    s = sched(max_num_seqs=2)
    a, b = seq(4, 3), seq(4, 3)
    s.add(a)
    s.add(b)
    advance(s, s.schedule())
    s.add(seq(4, 3))  # equal: waits
    out = s.schedule()
    assert not out.preempted and len(out.scheduled) == 2
    s2 = sched(max_num_seqs=3)
    x = seq(4, 9)
    s2.add(x)
    advance(s2, s2.schedule())
    y = seq(4, 0)
    s2.add(y)
    out = s2.schedule()  # a slot and blocks are free: nobody is preempted
    assert not out.preempted and {z.seq for z in out.scheduled} == {x, y}


def test_an_urgent_arrival_short_of_kv_blocks_preempts_the_least_urgent():
    # 6 blocks of 16: two running sequences of 40 tokens hold 3 blocks each
    s = sched(num_blocks=6, max_num_seqs=8)
    low, mid = seq(40, 9), seq(40, 4)
    s.add(low)
    s.add(mid)
    advance(s, s.schedule())
    urgent = seq(20, 1)  # needs 2 blocks, none free
    s.add(urgent)
    out = s.schedule()
    assert out.preempted == [low]
    assert urgent in [x.seq for x in out.scheduled] and mid in [x.seq for x in out.scheduled]


def test_kv_pressure_among_running_sequences_preempts_the_least_urgent_not_the_newest():
    s = sched(num_blocks=4, block_size=4, max_num_seqs=8, budget=64)
    old_low, new_high = seq(7, 9, arrival=1.0), seq(7, 0, arrival=2.0)
    s.add(old_low)
    s.add(new_high)
    out = s.schedule()
    assert {x.seq for x in out.scheduled} == {old_low, new_high}  # 2 blocks each
    advance(s, out)
    advance(s, s.schedule())  # position 7: still in their second blocks
    out = s.schedule()  # both need a third block for position 8: only one can have it
    assert out.preempted == [old_low] and [x.seq for x in out.scheduled] == [new_high]


def test_priority_is_validated():
    with pytest.raises(InvalidRequestError, match="priority"):
        SamplingParams(priority=2**31).validate(1000)
    with pytest.raises(InvalidRequestError, match="priority"):
        SamplingParams(priority=True).validate(1000)
    SamplingParams(priority=-5).validate(1000)
    with pytest.raises(ValueError, match="scheduling_policy"):
        Scheduler(BlockManager(4, 4), 2, 8, policy="lifo")


def test_engine_setting_is_validated(tiny_model_dir):
    model = ModelConfig.from_dir(tiny_model_dir)
    cfg = EngineConfig(model_dir=tiny_model_dir, device="cpu", scheduling_policy="Priority ")
    cfg.validate(model)
    assert cfg.scheduling_policy == "priority"
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineConfig(model_dir=tiny_model_dir, device="cpu", scheduling_policy="sjf").validate(model)


def _prompt(n: int, salt: int) -> list[int]:
    return np.random.default_rng(2000 + salt).integers(100, 40000, size=n).tolist()


def test_engine_urgent_request_starts_next_step_and_preempted_outputs_do_not_change(tiny_model_dir):
    engine = LLMEngine(EngineConfig(model_dir=tiny_model_dir, device="cpu", block_size=16, num_kv_blocks=64,
                                    max_model_len=128, max_num_seqs=3, max_num_batched_tokens=512,
                                    num_threads=2, scheduling_policy="priority"))
    greedy = dict(temperature=0.0, ignore_eos=True, max_tokens=24)
    low = {f"low{i}": _prompt(12 + i, i) for i in range(4)}
    alone = {}
    for rid, ids in {**low, "urgent": _prompt(10, 99)}.items():
        engine.add_request(rid, ids, SamplingParams(**greedy))
        toks = []
        while engine.has_unfinished_requests():
            for o in engine.step():
                toks += o.token_ids
        alone[rid] = toks
    for rid, ids in low.items():
        engine.add_request(rid, ids, SamplingParams(**greedy, priority=5))
    got = {rid: [] for rid in alone}
    first_step = {}
    step = 0

    def one_step():
        nonlocal step
        step += 1
        for o in engine.step():
            got[o.request_id] += o.token_ids
            if o.token_ids and o.request_id not in first_step:
                first_step[o.request_id] = step

    for _ in range(4):  # every slot busy decoding priority-5 streams, one more waiting
        one_step()
    assert len(engine.scheduler.running) == 3 and len(engine.scheduler.waiting) == 1
    engine.add_request("urgent", _prompt(10, 99), SamplingParams(**greedy, priority=0))
    sent_at = step
    while engine.has_unfinished_requests():
        one_step()
    assert first_step["urgent"] == sent_at + 1  # its first token in the very next step
    assert engine.scheduler.num_preemptions >= 1
    assert got == alone  # preempted and resumed sequences produce what they produce alone
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
