"""Property test of BlockManager + Scheduler: random add / step / finish / abort sequences.

Runs with and without the prefix cache (prompts then share prefixes on purpose). After every
operation: no block leaks (free + used == total, used == distinct blocks held by live sequences),
every block's ref count equals the number of live sequences holding it, a block is shared only when
it is a full, hashed block whose tokens equal every holder's tokens at that position, waiting and finished
sequences hold no blocks, and every step respects max_num_seqs and max_num_batched_tokens and gives
each scheduled sequence slots for all the tokens it computes. At the end all work drains (no
livelock under preemption) and every block is free again.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.scheduler import Scheduler
from paddle_llm_engine.sequence import Sequence, SequenceStatus


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(block_size=st.sampled_from([1, 2, 4, 8, 16]), max_model_len=st.integers(4, 96),
                extra_blocks=st.integers(0, 12), max_num_seqs=st.integers(1, 6), extra_budget=st.integers(0, 80),
                prefix_caching=st.booleans())
    def setup(self, block_size, max_model_len, extra_blocks, max_num_seqs, extra_budget, prefix_caching):
        num_blocks = -(-max_model_len // block_size) + extra_blocks  # the engine guarantees one full sequence fits
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
        self.sched = Scheduler(self.bm, max_num_seqs, max_num_seqs + extra_budget)
        self.max_model_len = max_model_len  # the engine's limit, checked after each step as it does
        self.seqs: list[Sequence] = []
        self.n = 0

    # -- operations -----------------------------------------------------------------------------
    @rule(data=st.data())
    def add(self, data):
        mml = self.max_model_len
        n_prompt = data.draw(st.integers(1, mml - 1), label="prompt_len")
        max_tokens = data.draw(st.integers(1, mml - n_prompt), label="max_tokens")
        # one of two shared prefixes (so the prefix cache has hits), then a request-specific tail
        family = data.draw(st.integers(0, 1), label="prefix")
        shared = data.draw(st.integers(0, n_prompt), label="shared_len")
        tokens = [10 + family * 50 + k % 40 for k in range(shared)] + [3 + (self.n + k) % 97
                                                                      for k in range(n_prompt - shared)]
        seq = Sequence(f"r{self.n}", tokens, SamplingParams(temperature=0.0), max_tokens, [2])
        self.n += 1
        self.seqs.append(seq)
        self.sched.add(seq)

    @rule()
    def step(self):
        self._step()

    @rule(data=st.data())
    def finish_running(self, data):
        if self.sched.running:
            seq = data.draw(st.sampled_from(self.sched.running), label="finish")
            self.sched.finish(seq, "stop")

    @rule(data=st.data())
    def abort_any(self, data):
        live = [s for s in self.seqs if not s.is_finished]
        if live:
            seq = data.draw(st.sampled_from(live), label="abort")
            self.sched.finish(seq, "abort")
            assert seq.block_table == [] and seq.is_finished

    def _step(self) -> None:
        sched, bm = self.sched, self.bm
        out = sched.schedule()
        assert len(out.scheduled) <= sched.max_num_seqs
        assert len(sched.running) <= sched.max_num_seqs
        assert out.num_tokens <= sched.max_num_batched_tokens
        ids = [id(s.seq) for s in out.scheduled]
        assert len(ids) == len(set(ids)), "a sequence scheduled twice in one step"
        for p in out.preempted:
            assert p.block_table == [] and p.num_computed_tokens == 0 and p.status == SequenceStatus.WAITING
            assert id(p) not in ids
        for s in out.scheduled:
            assert s.num_new_tokens >= 1
            assert s.seq.num_computed_tokens + s.num_new_tokens <= s.seq.num_tokens
            assert len(s.seq.block_table) * bm.block_size >= s.seq.num_computed_tokens + s.num_new_tokens
            assert s.seq.status == SequenceStatus.RUNNING
        # What the engine does after the model ran.
        sampled = [s for s in out.scheduled if s.samples]
        for s in out.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
            bm.commit_full_blocks(s.seq)
        for s in sampled:
            s.seq.append_token(5)
            reason = s.seq.check_stop(self.max_model_len)
            if reason is not None:
                sched.finish(s.seq, reason)

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def blocks_consistent(self):
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        live = [s for s in self.seqs if not s.is_finished]
        holders: dict[int, list[tuple[Sequence, int]]] = {}
        for s in live:
            assert len(s.block_table) == len(set(s.block_table)), "a sequence holds a block twice"
            for i, b in enumerate(s.block_table):
                holders.setdefault(b, []).append((s, i))
        for b, hs in holders.items():
            assert bm.ref_counts[b] == len(hs), f"block {b}: ref count {bm.ref_counts[b]}, holders {len(hs)}"
            if len(hs) > 1:
                assert bm.enable_prefix_caching, "two live sequences share a block without prefix caching"
                content = bm._block_tokens[b]
                assert content is not None, "a shared block is not a full, hashed block"
                bs = bm.block_size
                for s, i in hs:
                    assert tuple(s.token_ids[i * bs:(i + 1) * bs]) == content, "shared block with other tokens"
                    assert s.num_computed_tokens >= (i + 1) * bs or s.status == SequenceStatus.RUNNING
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        assert bm.num_used_blocks == len(holders), "leaked or double-counted block"
        free = list(bm._free)
        assert len(free) == len(set(free)) and set(free).isdisjoint(holders)
        assert all(bm.ref_counts[b] == 0 for b in free)
        for s in self.seqs:
            if s.is_finished or s.status == SequenceStatus.WAITING:
                assert s.block_table == [], f"{s.status} sequence holds blocks"
            else:
                assert len(s.block_table) * bm.block_size >= s.num_computed_tokens
        assert {id(s) for s in self.sched.running} == {id(s) for s in live if s.status == SequenceStatus.RUNNING}
        assert {id(s) for s in self.sched.waiting} == {id(s) for s in live if s.status == SequenceStatus.WAITING}

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        # Every remaining sequence must complete: at most (tokens to compute) steps, since each step
        # in which nothing was preempted advances the oldest running sequence.
        bound = 4 * sum(s.max_tokens + s.num_tokens for s in self.seqs) + 10
        for _ in range(bound):
            if not self.sched.has_work():
                break
            self._step()
            self.blocks_consistent()
        assert not self.sched.has_work(), "scheduler did not drain (livelock)"
        assert all(s.is_finished for s in self.seqs)
        assert all(s.num_output_tokens >= 1 or s.finish_reason in ("stop", "abort") for s in self.seqs)
        assert self.bm.num_free_blocks == self.bm.num_blocks


SchedulerMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=40, deadline=None, database=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestScheduler = SchedulerMachine.TestCase
pytestmark = pytest.mark.slow  # a property search of about 15-20 s: the full tier only
