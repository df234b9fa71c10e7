"""One engine step as plain data: what the scheduler decided for each sequence, built once per step.

The engine builds a Step from the scheduler's output (build_step) and hands it to its executor;
a Worker packs it into tensors (worker/inputs.py) and returns the logits of the sampled rows.
Nothing in a Step is a live engine object: it holds ints, strings and tuples only, so it pickles
as it is to the tensor-parallel ranks and no worker can change a sequence, a block table or a
request through it.

Order: the decoding entries (one new token) first, then the prompt chunks, as the model packs its
tokens; the logits rows a worker returns follow the entries that sample, in this order.
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
    """

    request_id: str
    seq_index: int
    token_ids: tuple[int, ...]
    start: int
    block_table: tuple[int, ...]
    samples: bool
    forks: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        """Tokens this step computes for the sequence."""
        return len(self.token_ids)


@dataclass(frozen=True)
class Step:
    """seqs: the step's sequences, decodes first; copies: copy-on-write KV block copies (src, dst)
    made before the step writes the cache."""

    seqs: tuple[SeqStep, ...]
    copies: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    @property
    def sampled(self) -> tuple[SeqStep, ...]:
        """The entries that produce a logits row, in row order."""
        return tuple(s for s in self.seqs if s.samples)

    @property
    def num_sampled(self) -> int:
        """Logits rows the step produces."""
        return sum(1 for s in self.seqs if s.samples)


def build_step(scheduled, copies=(), forks_of=None) -> Step:
    """The Step of the scheduler's decisions.

    scheduled: the scheduler's ScheduledSeq list (sequence, num_new_tokens); copies: its
    copy-on-write pairs; forks_of(seq) -> the sibling Sequences to fork from `seq` (called only for
    entries that sample a sequence's first token; None: no forks)."""
    entries = []
    for s in sorted(scheduled, key=lambda s: s.num_new_tokens > 1):  # stable: decodes first
        seq, start, n = s.seq, s.seq.num_computed_tokens, s.num_new_tokens
        forks = ()
        if forks_of is not None and s.samples and seq.num_output_tokens == 0:
            forks = tuple(c.seq_index for c in forks_of(seq))
        entries.append(SeqStep(seq.request_id, seq.seq_index, tuple(seq.token_ids[start:start + n]), start,
                               tuple(seq.block_table), s.samples, forks))
    return Step(tuple(entries), tuple(tuple(p) for p in copies))
