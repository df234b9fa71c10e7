"""One engine step as plain data: what the scheduler decided for each sequence, built once per step.

The engine builds a Step from the scheduler's output (build_step) and hands it to its executor;
a Worker packs it into tensors (worker/inputs.py) and returns the logits of the sampled rows.
Nothing in a Step is a live engine object: it holds ints, strings and tuples only, so it pickles
as it is to the tensor-parallel ranks and no worker can change a sequence, a block table or a
request through it.

Order: the decoding entries (one new token) first, then the multi-token entries (prompt chunks and
speculative verifies), as the model packs its tokens; the logits rows a worker returns follow the
entries that sample, in this order: 1 row per entry, 1 + len(draft_token_ids) rows for an entry
with draft tokens (speculative decoding, spec_decode/), its positions in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SeqStep:
    """One sequence in one step.

    request_id / seq_index: whose sequence (seq_index: which of the request's params.n sequences).
    token_ids: the tokens this step computes, token_ids[i] at position start + i.
    start: how many leading tokens of the sequence already have their K/V in the cache.
    block_table: the sequence's KV block ids, covering positions 0 .. start + len(token_ids) - 1.
    samples: the step reaches the sequence's last token, so a logits row is produced for it.
    forks: seq_index of the sibling sequences (n > 1) forked from this one when it samples its
        first token; each draws its own first token from this entry's logits row (engine side).
    draft_token_ids: speculative decoding: the proposed tokens this step verifies. They are the
        last len(draft_token_ids) of token_ids (token_ids = (the sequence's last token,) + drafts)
        and not yet tokens of the sequence; the entry returns one logits row per position of
        its last token and drafts (1 + len(draft_token_ids) rows).
    lora_slot: the device slot of the sequence's LoRA adapter (Step.lora_loads fill the slots);
        -1: the base model.
    """

    request_id: str
    seq_index: int
    token_ids: tuple[int, ...]
    start: int
    block_table: tuple[int, ...]
    samples: bool
    forks: tuple[int, ...] = ()
    draft_token_ids: tuple[int, ...] = ()
    lora_slot: int = -1

    @property
    def num_tokens(self) -> int:
        """Tokens this step computes for the sequence."""
        return len(self.token_ids)

    @property
    def num_rows(self) -> int:
        """Logits rows this entry returns: 0 unless it samples, else 1 + its draft tokens."""
        return 1 + len(self.draft_token_ids) if self.samples else 0


@dataclass(frozen=True)
class Step:
    """seqs: the step's sequences, decodes first; copies: copy-on-write KV block copies (src, dst)
    made before the step writes the cache; lora_loads: LoRA adapters the worker puts into device
    slots before the step (lora.registry.LoraLoad)."""

    seqs: tuple[SeqStep, ...]
    copies: tuple[tuple[int, int], ...] = field(default_factory=tuple)
    lora_loads: tuple = ()

    def row_lora_slots(self):
        """[tokens] int32 numpy: the LoRA slot of each token row in packing order (-1: none), or None
        when no entry has an adapter."""
        if all(s.lora_slot < 0 for s in self.seqs):
            return None
        import numpy as np

        return np.concatenate([np.full(s.num_tokens, s.lora_slot, np.int32) for s in self.seqs])

    @property
    def sampled(self) -> tuple[SeqStep, ...]:
        """The entries that produce a logits row, in row order."""
        return tuple(s for s in self.seqs if s.samples)

    @property
    def num_sampled(self) -> int:
        """Logits rows the step produces (an entry with draft tokens produces 1 + drafts)."""
        return sum(s.num_rows for s in self.seqs)

    def row_offsets(self) -> list[int]:
        """The first logits row of each entry of `sampled`, in order."""
        out, row = [], 0
        for s in self.sampled:
            out.append(row)
            row += s.num_rows
        return out


def build_step(scheduled, copies=(), forks_of=None, lora_slots=None, lora_loads=()) -> Step:
    """The Step of the scheduler's decisions.

    scheduled: the scheduler's ScheduledSeq list (sequence, num_new_tokens); copies: its
    copy-on-write pairs; forks_of(seq) -> the sibling Sequences to fork from `seq` (called only for
    entries that sample a sequence's first token; None: no forks); lora_slots: {lora_id: slot} of
    the step's adapters (LoraRegistry.assign_slots) with the lora_loads that fill them."""
    entries = []
    for s in sorted(scheduled, key=lambda s: s.num_new_tokens > 1):  # stable: decodes first
        seq, start, n = s.seq, s.seq.num_computed_tokens, s.num_new_tokens
        drafts = tuple(s.draft_token_ids)
        forks = ()
        if forks_of is not None and s.samples and seq.num_output_tokens == 0:
            forks = tuple(c.seq_index for c in forks_of(seq))
        tokens = tuple(seq.token_ids[start:start + n - len(drafts)]) + drafts
        slot = lora_slots[seq.lora.lora_id] if seq.lora is not None else -1
        entries.append(SeqStep(seq.request_id, seq.seq_index, tokens, start,
                               tuple(seq.block_table), s.samples, forks, drafts, slot))
    return Step(tuple(entries), tuple(tuple(p) for p in copies), tuple(lora_loads))
