"""N-gram (prompt-lookup) proposer: vLLM's `ngram` speculative method.

Flow of one speculative step (engine side; the worker only computes more rows):
1. proposer (this module): for a decoding sequence, the draft tokens: the tokens that followed the
   most recent earlier occurrence of its last n tokens (n = prompt_lookup_max down to
   prompt_lookup_min), at most num_speculative_tokens of them.
2. scheduler: the sequence is scheduled for 1 + d tokens (its last token and the d drafts; KV
   blocks and the step's token budget count them all); the drafts stay in the step entry
   (SeqStep.draft_token_ids), they are not the sequence's tokens yet.
3. worker: 1 + d logits rows come back for that entry (row j predicts the token after
   position start + j).
4. verify (engine, rejection.py): row by row, with the same logits processing as plain sampling
   given the tokens accepted so far, accept drafts (greedy: draft == argmax; sampled: the
   rejection rule), append the first non-accepted token (a correction) or, after all d were
   accepted, the bonus token of the last row; stop at the first appended token that finishes.
5. rollback: num_computed_tokens counts only the KV of accepted tokens (rejected positions' KV
   slots are overwritten later), blocks wholly past the sequence are freed and the prefix cache
   commits only full blocks of accepted tokens.

Per-sequence switch-off (SpecState): an exponentially weighted moving average (weight 0.5) of
accepted / proposed over the sequence's speculative steps; below SWITCH_OFF_ACCEPTANCE the sequence
does not propose for `backoff` decode steps (8 at first, doubling up to 64 while probes keep
failing), then proposes once more (a probe) whose result updates the average; above the threshold
again the backoff returns to 8. Steps where no n-gram matches cost only the match and do not count.

Guided decoding: guided sequences speculate like the others. The verify consumes into the guide's
matcher only the tokens it appends (accepted drafts, then the correction or bonus token), one at a
time, and the next position's mask is the one computed after them; rejected drafts never reach the
matcher, so no rollback is needed (llguidance's LLMatcher.rollback is not used). The cost: the masks
of the accepted positions are computed one after another inside the verify instead of overlapping
the next model step.

Complexity: propose_ngram is O((max_n - min_n + 1) * max_n * L) numpy element operations for a
sequence of L tokens (one vectorized comparison per n-gram element over all positions), i.e.
O(L) per proposal for fixed n, plus one O(L) list -> array copy.
"""

from __future__ import annotations

import numpy as np

SWITCH_OFF_ACCEPTANCE = 0.2
EWMA_WEIGHT = 0.5
BACKOFF_MIN = 8
BACKOFF_MAX = 64


def propose_ngram(token_ids, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k draft tokens for a sequence whose tokens (prompt + output) are token_ids.

    For n from n_max down to n_min (n < len(token_ids)): find the most recent earlier occurrence
    of the last n tokens (its start i < len - n) and return the up to k tokens that followed it
    (token_ids[i + n : i + n + k], at least one). [] when nothing matches or k <= 0."""
    length = len(token_ids)
    if k <= 0 or length < 2:
        return []
    arr = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        m = length - n  # candidate starts 0 .. m - 1 (m: the suffix itself, excluded)
        tail = arr[m:]
        hit = arr[:m] == tail[0]
        for j in range(1, n):
            if not hit.any():
                break
            hit &= arr[j:m + j] == tail[j]
        idx = np.flatnonzero(hit)
        if idx.size:
            i = int(idx[-1])
            return arr[i + n:i + n + k].tolist()
    return []


class SpecState:
    """One sequence's acceptance record (see the module docstring's switch-off rule)."""

    __slots__ = ("acceptance", "skip", "backoff")

    def __init__(self):
        self.acceptance = 1.0  # EWMA of accepted / proposed
        self.skip = 0          # decode steps left without proposals
        self.backoff = BACKOFF_MIN

    def should_propose(self) -> bool:
        """Called once per decode step of the sequence: False while it is switched off."""
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    def record(self, proposed: int, accepted: int) -> None:
        """The verify result of one speculative step of the sequence."""
        if proposed <= 0:
            return
        self.acceptance = (1 - EWMA_WEIGHT) * self.acceptance + EWMA_WEIGHT * (accepted / proposed)
        if self.acceptance < SWITCH_OFF_ACCEPTANCE:
            self.skip = self.backoff
            self.backoff = min(BACKOFF_MAX, 2 * self.backoff)
        else:
            self.backoff = BACKOFF_MIN


class NgramProposer:
    """The proposer of one engine: k = num_speculative_tokens, n = prompt_lookup_min .. max."""

    def __init__(self, k: int, n_min: int, n_max: int, max_model_len: int):
        self.k, self.n_min, self.n_max, self.max_model_len = k, n_min, n_max, max_model_len

    def __call__(self, seq, budget: int) -> tuple[int, ...]:
        """Draft tokens for decoding sequence `seq` (at most `budget`), bounded so that even with
        every draft accepted plus the bonus token the sequence stays within its max_tokens and
        max_model_len. () when the sequence does not speculate (no SpecState, switched off) or
        nothing matches."""
        st = getattr(seq, "spec", None)
        if st is None or not st.should_propose():
            return ()
        k = min(self.k, budget, seq.max_tokens - seq.num_output_tokens - 1,
                self.max_model_len - seq.num_tokens - 1)
        if k <= 0:
            return ()
        return tuple(propose_ngram(seq.token_ids, k, self.n_min, self.n_max))
