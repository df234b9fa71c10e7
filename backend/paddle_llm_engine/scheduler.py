"""Continuous-batching scheduler: which sequences run in the next step, and how many tokens each.

Policy per step (token budget `max_num_batched_tokens`, at most `max_num_seqs` sequences):
1. Running sequences first, oldest first. One with pending tokens > 1 (a prompt chunk or a
   recompute) gets min(pending, budget left); a decoding one gets 1 token. When the KV cache has
   no block for it, the newest running sequence is preempted (blocks freed, recomputed later).
2. Then waiting sequences in arrival order, as long as the budget, the sequence limit and the
   free blocks allow; leading blocks found in the prefix cache are not recomputed, and a prompt
   longer than the budget left is chunked (chunked prefill).
While any running sequence decodes, the prompt tokens of a step (both kinds above) are capped at
`prefill_chunk_size`: a wave of arriving prompts is spread over several steps instead of stalling
every running stream for the whole wave's prefill.
A step therefore mixes prefills and decodes. The scheduler never touches tensors.

Scheduling policy (`policy`, EngineConfig.scheduling_policy; vLLM's names and order):
- "fcfs": the order above; the victim of a preemption is the newest running sequence.
- "priority": the waiting queue is ordered by (SamplingParams.priority, arrival time), a lower
  priority value first; running sequences are served most urgent first, and the victim of a
  preemption is the least urgent (highest value, then newest). Before each step, while the most
  urgent waiting sequence is strictly more urgent than the least urgent running one and lacks a
  sequence slot or KV blocks for its first chunk, that running sequence is preempted (recompute: its
  tokens are kept and computed again when it is admitted, so its output does not change).
Speculative decoding (a `proposer` given): a decoding sequence may get d draft tokens
(ScheduledSeq.draft_token_ids) and is then scheduled for 1 + d tokens: the budget and its KV blocks
count them all; when its blocks do not fit, it is first scheduled without drafts before anything
is preempted. Drafts never become tokens of the sequence here: the engine appends the verified ones
and calls `rollback`.

After a step, the token state changes here too (the engine calls these in LLMEngine's
_update_from_output): computed tokens advance and full blocks join the prefix cache (advance),
sequences of an n > 1 request fork from their first sibling (fork), each sampled token is
appended with its logprob and checked against EOS, stop ids and the length limits (append_token),
and a finished sequence leaves the queues with its blocks freed (finish).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """One scheduling decision: compute num_new_tokens tokens of `seq` from seq.num_computed_tokens on."""

    seq: Sequence
    num_new_tokens: int
    draft_token_ids: tuple[int, ...] = ()  # speculative: proposed tokens, counted in num_new_tokens

    @property
    def samples(self) -> bool:
        """True when this step reaches the sequence's last token, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens - len(self.draft_token_ids) == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # copy-on-write KV block copies (src, dst) the worker makes before this step's writes
    copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


SCHEDULING_POLICIES = ("fcfs", "priority")


def urgency(seq: Sequence) -> tuple:
    """The priority policy's sort key: lower is served first (priority value, arrival, sequence index)."""
    return seq.params.priority, seq.arrival_time, seq.seq_index


class Scheduler:
    """Holds the waiting and running queues and the block manager."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 prefill_chunk_size: int = 0, proposer=None, policy: str = "fcfs", max_loras: int = 0):
        """prefill_chunk_size: when any running sequence decodes, the prompt tokens (new prompts,
        prompt chunks, recomputes) of one step are capped at this many, so running decodes wait for
        at most one chunk's compute when prompts arrive in waves; 0: only max_num_batched_tokens.
        proposer(seq, budget) -> draft token ids (at most budget) for a decoding sequence
        (speculative decoding, spec_decode/); None: no speculation.
        policy: "fcfs" or "priority" (module doc). Raises ValueError for another value.
        max_loras: distinct LoRA adapters the running sequences may use at once (the workers' device
        slots); a waiting sequence of a further adapter is passed over, keeping its place, until one
        of them has no running sequence. 0: LoRA off."""
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {policy!r}")
        self.policy = policy
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_chunk_size = prefill_chunk_size
        self.proposer = proposer
        self.max_loras = max_loras
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self._enqueue(seq, front=False)

    def _enqueue(self, seq: Sequence, front: bool) -> None:
        """fcfs: at the back (new) or the front (preempted); priority: at its urgency's place."""
        if self.policy == "priority":
            keys = [urgency(s) for s in self.waiting]
            self.waiting.insert(bisect.bisect_right(keys, urgency(seq)), seq)
        elif front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A sequence forked from a running one (its blocks shared, its prompt computed)."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # Tokens of prompts this step may take: bounded while sequences decode (see __init__).
        prefill_left = budget
        if self.prefill_chunk_size and any(seq.num_pending_tokens == 1 for seq in self.running):
            prefill_left = min(budget, self.prefill_chunk_size)
        if self.policy == "priority":
            self._preempt_for_urgent(out, prefill_left)
            self.running.sort(key=urgency)  # the victims below are taken from the end
        made_room = len(out.preempted)  # preemptions for an urgent arrival do not stop admissions
        running: list[Sequence] = []
        queue = deque(self.running)
        while queue:
            seq = queue.popleft()
            pending = seq.num_pending_tokens
            if budget == 0 or (pending > 1 and prefill_left == 0):
                running.append(seq)
                continue
            n = min(pending, budget) if pending == 1 else min(pending, budget, prefill_left)
            drafts = ()
            if pending == 1 and self.proposer is not None and budget > 1:
                drafts = self.proposer(seq, budget - 1)
                if drafts and not self.blocks.can_allocate(
                        self.blocks.blocks_needed(seq, seq.num_computed_tokens + 1 + len(drafts))):
                    drafts = ()  # no room for the drafts: decode plainly rather than preempt
                n += len(drafts)
            # Make room: preempt the newest running sequences (never `seq` itself unless alone).
            while not self.blocks.can_allocate(self.blocks.blocks_needed(seq, seq.num_computed_tokens + n)):
                victim = queue.pop() if queue else None
                if victim is None:
                    self._preempt(seq, out)
                    seq = None
                    break
                self._preempt(victim, out)
            if seq is None:
                continue
            self.blocks.allocate(seq, seq.num_computed_tokens + n)
            out.scheduled.append(ScheduledSeq(seq, n, drafts))
            running.append(seq)
            budget -= n
            if pending > 1:
                prefill_left -= n
        self.running = running

        self._admit(out, budget, prefill_left, stop_at=made_room)
        out.copies = self.blocks.take_copies()
        return out

    def _admit(self, out: SchedulerOutput, budget: int, prefill_left: int, stop_at: int) -> None:
        """Admit waiting sequences in queue order while budget, slots and KV blocks allow (none once
        the running ones needed a preemption beyond the first `stop_at`: the cache is short)."""
        passed: list[Sequence] = []  # LoRA: waiting for an adapter slot, put back in order below
        loras = {s.lora.lora_id for s in self.running if s.lora is not None} if self.max_loras else set()
        while (self.waiting and budget > 0 and prefill_left > 0 and len(self.running) < self.max_num_seqs
               and len(out.preempted) == stop_at):
            seq = self.waiting[0]
            if self.max_loras and seq.lora is not None and seq.lora.lora_id not in loras \
                    and len(loras) >= self.max_loras:
                passed.append(self.waiting.popleft())
                continue
            n = self.blocks.allocate_prompt(seq, min(budget, prefill_left))  # reuses cached prefix blocks
            if n is None:
                break
            self.waiting.popleft()
            if seq.lora is not None:
                loras.add(seq.lora.lora_id)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            prefill_left -= n
        self.waiting.extendleft(reversed(passed))

    def _preempt_for_urgent(self, out: SchedulerOutput, prefill_left: int) -> None:
        """Priority policy, before a step: preempt the least urgent running sequences while the most
        urgent waiting one is strictly more urgent and lacks a slot or the KV blocks of its first
        chunk (at most prefill_left tokens; counted without prefix-cache hits, so this may free a
        little more than the cache would need)."""
        while self.waiting and self.running:
            head = self.waiting[0]
            victim = max(self.running, key=urgency)
            if victim.params.priority <= head.params.priority:
                return
            first_chunk = min(head.num_tokens, prefill_left)
            if (len(self.running) < self.max_num_seqs
                    and self.blocks.can_allocate(self.blocks.blocks_needed(head, first_chunk))):
                return
            self.running.remove(victim)
            self._preempt(victim, out)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute-style preemption: free all blocks, requeue (fcfs: at the front of waiting)."""
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self._enqueue(seq, front=True)
        self.num_preemptions += 1
        out.preempted.append(seq)

    # -- after a step ----------------------------------------------------------------------------
    def advance(self, scheduled: list[ScheduledSeq]) -> None:
        """The step computed its tokens: their K/V are in the cache, full blocks become reusable."""
        for s in scheduled:  # drafts: their KV counts only once verified (rollback)
            s.seq.num_computed_tokens += s.num_new_tokens - len(s.draft_token_ids)
            self.blocks.commit_full_blocks(s.seq)

    def rollback(self, seq: Sequence, num_accepted: int) -> None:
        """After a speculative verify of `seq` (its verified tokens appended): the KV of its
        num_accepted accepted drafts is valid, the rejected positions' is not (their slots are
        overwritten when those positions are computed again). Counts the accepted ones computed,
        frees the blocks that lie wholly past the sequence's tokens, and commits the full blocks of
        computed (accepted) tokens to the prefix cache. A finished sequence has no blocks left."""
        if seq.is_finished:
            return
        seq.num_computed_tokens += num_accepted
        assert seq.num_computed_tokens < seq.num_tokens, "a verified sequence keeps its last token pending"
        self.blocks.trim(seq, seq.num_tokens)
        self.blocks.commit_full_blocks(seq)

    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """Sequences of parent's request (n > 1) join the running queue sharing its KV blocks (its
        prompt is computed; they sample their first tokens from its logits row)."""
        for c in children:
            self.blocks.fork(parent, c)
            c.first_scheduled_time = parent.first_scheduled_time
            self.add_running(c)

    def append_token(self, seq: Sequence, token: int, logprob: tuple, now: float, max_model_len: int) -> str | None:
        """Append a sampled token (logprob: (its logprob, top alternatives); now: time.monotonic()
        seconds). Returns the finish reason the token state gives ("stop": EOS or a stop id,
        "length": max_tokens or max_model_len), or None to go on; the caller finishes the sequence."""
        seq.append_token(token)
        seq.record_logprob(*logprob)
        seq.last_token_time = now
        if seq.first_token_time is None:
            seq.first_token_time = now
        return seq.check_stop(max_model_len)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished and free its blocks at once (normal end, stop string or abort)."""
        if seq.status == SequenceStatus.FINISHED:
            return
        if seq in self.running:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
