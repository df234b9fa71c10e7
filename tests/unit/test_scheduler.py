"""Scheduler policy on bare Sequences (no model): limits, chunked prefill, decode-first order,
preemption bookkeeping. End-to-end preemption with a real (tiny) model is in test_engine_tiny.py."""

from __future__ import annotations

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.scheduler import Scheduler, SchedulerOutput
from paddle_llm_engine.sequence import Sequence, SequenceStatus

_counter = iter(range(10**9))


def make_seq(n_prompt: int, max_tokens: int = 8) -> Sequence:
    i = next(_counter)
    return Sequence(f"r{i}", [100 + (i + k) % 50 for k in range(n_prompt)], SamplingParams(temperature=0.0),
                    max_tokens, [2])


def make_sched(num_blocks=64, block_size=16, max_num_seqs=8, budget=256) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, budget)


def advance(sched: Scheduler, out: SchedulerOutput, token: int = 7, max_model_len: int = 512) -> list[Sequence]:
    """What the engine does after the model ran: count computed tokens, append sampled tokens, finish
    sequences that reached max_tokens (or max_model_len). Returns the sequences that sampled."""
    live = [s for s in out.scheduled if not s.seq.is_finished]  # the engine skips aborted ones
    sampled = [s for s in live if s.samples]
    for s in live:
        s.seq.num_computed_tokens += s.num_new_tokens
    for s in sampled:
        s.seq.append_token(token)
        if s.seq.check_stop(max_model_len) is not None:
            sched.finish(s.seq, "length")
    return [s.seq for s in sampled]


def test_max_num_seqs_respected():
    sched = make_sched(max_num_seqs=3)
    seqs = [make_seq(4) for _ in range(10)]
    for s in seqs:
        sched.add(s)
    out = sched.schedule()
    assert [s.seq for s in out.scheduled] == seqs[:3]
    advance(sched, out)
    for _ in range(3):
        out = sched.schedule()
        assert len(out.scheduled) <= 3 and len(sched.running) <= 3
        assert all(s.num_new_tokens == 1 for s in out.scheduled)  # decodes only, nobody admitted
        advance(sched, out)
    sched.finish(seqs[1], "abort")
    out = sched.schedule()
    assert [s.seq for s in out.scheduled] == [seqs[0], seqs[2], seqs[3]]
    assert [s.num_new_tokens for s in out.scheduled] == [1, 1, 4]


def test_max_num_batched_tokens_respected_and_chunks_the_last_admitted():
    sched = make_sched(budget=64)
    seqs = [make_seq(40) for _ in range(3)]
    for s in seqs:
        sched.add(s)
    out = sched.schedule()
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(seqs[0], 40), (seqs[1], 24)]
    assert out.num_tokens == 64
    assert out.scheduled[0].samples and not out.scheduled[1].samples
    advance(sched, out)
    out = sched.schedule()
    # seq0 decodes (1), seq1 finishes its prompt (16), seq2 gets the rest of the budget (47 of 40 -> 40).
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(seqs[0], 1), (seqs[1], 16), (seqs[2], 40)]
    assert out.num_tokens <= 64


def test_chunked_prefill_splits_long_prompt():
    sched = make_sched(budget=32)
    seq = make_seq(100)
    sched.add(seq)
    chunks, samples = [], []
    while seq.num_output_tokens == 0:
        out = sched.schedule()
        assert out.num_tokens <= 32
        (s,) = out.scheduled
        chunks.append(s.num_new_tokens)
        samples.append(s.samples)
        advance(sched, out)
    assert chunks == [32, 32, 32, 4]
    assert samples == [False, False, False, True]
    assert len(seq.block_table) == -(-101 // 16)  # 101 tokens now, the 101st gets a slot next step


def test_decodes_scheduled_before_new_prefills():
    sched = make_sched(budget=16)
    a = make_seq(8)
    sched.add(a)
    advance(sched, sched.schedule())
    b = make_seq(50)
    sched.add(b)
    out = sched.schedule()
    # The running (decoding) sequence first with 1 token; the new prompt gets the budget left.
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(a, 1), (b, 15)]
    # Even with the budget exhausted by a long running prefill, a decode scheduled earlier keeps its token.
    advance(sched, out)
    out = sched.schedule()
    assert out.scheduled[0].seq is a and out.scheduled[0].num_new_tokens == 1
    assert out.num_tokens == 16


def test_preemption_frees_blocks_and_requeues_newest_first():
    # 6 blocks of 4 tokens: two 8-token prompts take 2 blocks each, their 9th tokens a 3rd each; the
    # 13th token of the older one needs a 4th block, so the newer one is preempted.
    sched = make_sched(num_blocks=6, block_size=4, budget=64)
    old, new = make_seq(8, max_tokens=16), make_seq(8, max_tokens=16)
    sched.add(old)
    sched.add(new)
    out = sched.schedule()
    assert len(out.scheduled) == 2 and sched.blocks.num_free_blocks == 2
    preempted_at = None
    for step in range(40):
        out = sched.schedule()
        if out.preempted:
            preempted_at = step
            assert out.preempted == [new]
            assert new.block_table == [] and new.num_computed_tokens == 0
            assert new.status == SequenceStatus.WAITING and sched.waiting[0] is new
            assert new.num_preemptions == 1 and sched.num_preemptions == 1
            assert all(s.seq is not new for s in out.scheduled)
            assert sched.blocks.num_used_blocks == len(old.block_table)
            break
        advance(sched, out, max_model_len=24)
    assert preempted_at is not None
    advance(sched, out, max_model_len=24)
    # Drive to completion: the preempted sequence is recomputed and finishes; no block leaks.
    for _ in range(200):
        if not sched.has_work():
            break
        out = sched.schedule()
        assert sched.blocks.num_used_blocks == sum(len(s.block_table) for s in sched.running)
        advance(sched, out, max_model_len=24)
    assert not sched.has_work()
    assert old.num_output_tokens == 16 and new.num_output_tokens == 16
    assert sched.blocks.num_free_blocks == 6


def test_finish_and_abort_free_blocks():
    sched = make_sched(num_blocks=8, block_size=16, budget=64)
    a, b, c = make_seq(20), make_seq(20), make_seq(20)
    for s in (a, b, c):
        sched.add(s)
    out = sched.schedule()  # a: 20, b: 20, c: 24 of 20 -> 20  (budget 64)
    assert sched.blocks.num_used_blocks == 6
    sched.finish(b, "abort")
    assert b.block_table == [] and b.status == SequenceStatus.FINISHED and b.finish_reason == "abort"
    assert sched.blocks.num_used_blocks == 4
    sched.finish(b, "abort")  # idempotent
    assert sched.blocks.num_used_blocks == 4
    d = make_seq(5)
    sched.add(d)
    sched.finish(d, "abort")  # aborting a waiting sequence removes it from the queue
    assert d not in sched.waiting
    advance(sched, out)
    for s in (a, c):
        sched.finish(s, "stop")
    assert sched.blocks.num_free_blocks == 8 and not sched.has_work()


def test_prefill_chunk_caps_prompt_tokens_while_sequences_decode():
    """A wave of prompts arriving while streams decode: each step keeps every decode and adds at most
    prefill_chunk_size prompt tokens; without decodes running, the whole budget is used."""
    sched = Scheduler(BlockManager(256, 16, enable_prefix_caching=False), max_num_seqs=32, max_num_batched_tokens=2048,
                      prefill_chunk_size=100)
    first = [make_seq(30) for _ in range(2)]
    for s in first:
        sched.add(s)
    out = sched.schedule()  # nothing decodes yet: both prompts whole (60 tokens)
    assert [(x.seq, x.num_new_tokens) for x in out.scheduled] == [(first[0], 30), (first[1], 30)]
    advance(sched, out)
    wave = [make_seq(70) for _ in range(4)]
    for s in wave:
        sched.add(s)
    steps = []
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in wave):
        out = sched.schedule()
        decodes = [x for x in out.scheduled if x.seq in first]
        prompt_tokens = sum(x.num_new_tokens for x in out.scheduled
                            if x.seq.num_computed_tokens < x.seq.num_prompt_tokens)
        assert [x.num_new_tokens for x in decodes] == [1, 1], "a running stream missed a step"
        assert prompt_tokens <= 100
        steps.append(prompt_tokens)
        advance(sched, out)
    assert sum(steps) == 4 * 70 and len(steps) == 3  # 100 + 100 + 80, chunked across the prompts
    # 0 turns the cap off: the whole wave in one step
    sched0 = Scheduler(BlockManager(256, 16, enable_prefix_caching=False), max_num_seqs=32, max_num_batched_tokens=2048)
    a = make_seq(30)
    sched0.add(a)
    advance(sched0, sched0.schedule())
    more = [make_seq(70) for _ in range(4)]
    for s in more:
        sched0.add(s)
    assert sum(x.num_new_tokens for x in sched0.schedule().scheduled) == 1 + 4 * 70
