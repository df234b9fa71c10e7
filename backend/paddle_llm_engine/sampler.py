"""Turn the last-position logits of each sampled sequence into its next token.

Runs on host memory in numpy: one [B, V] copy per step, after which every row is processed with
its own parameters and its own RNG (a request's draws never depend on its batch mates).
Order of processing (HF `generate` / vLLM): allowed_token_ids mask and logit_bias (vLLM applies
them first) -> min_tokens mask -> repetition, presence and frequency
penalties -> guided-decoding mask (guided.py; computed off this path) -> temperature -> top-k ->
top-p -> min-p -> draw. Penalties and the guide also apply to greedy rows.
A thinking sequence (reasoning/base.py ThinkingState) whose budget ran out emits its family's end
sequence instead of drawing (the row's logprob entry is still the model's for that token), and
its guide waits until the thinking span is over (vLLM's reasoning-aware structured outputs).

The engine calls `sample` on the logits its executor returned, with each row's Sequence (its
tokens so far) and SamplingState (what the request's state derived from its params: generator,
masks, bias arrays, guide).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.sequence import Sequence


@dataclass
class SamplingState:
    """What one sequence samples with beyond its params, derived once when its request is added and
    kept in the request's state (never on the params, which are frozen):

    rng: the sequence's own generator (numpy PCG64 seeded with params.seed + seq_index), None when
        greedy; suppress_ids: the ids min_tokens masks (stop ids, and EOS unless ignore_eos);
    bad_words_ids: token sequences that must not be generated (params.bad_words tokenized, plus
        params.bad_words_ids); bias_ids / bias_values: logit_bias as arrays; allowed:
        allowed_token_ids as a sorted unique int64 array, or None; guide: the sequence's
        guided.GuideState, or None; thinking: the sequence's reasoning.ThinkingState, or None
        (no reasoning parser)."""

    params: SamplingParams
    rng: np.random.Generator | None
    suppress_ids: list[int]
    bad_words_ids: tuple = ()
    bias_ids: np.ndarray | None = None
    bias_values: np.ndarray | None = None
    allowed: np.ndarray | None = None
    guide: object = None
    thinking: object = None

    @classmethod
    def create(cls, params: SamplingParams, seq_index: int = 0, eos_token_ids=(), bad_words_ids=(),
               guide=None, thinking=None) -> "SamplingState":
        """The state of sequence `seq_index` of a request (sequence i draws with the seed
        params.seed + i (mod 2^64), so it samples exactly as a request with that seed and n = 1)."""
        seed = params.seed if params.seed is None or not seq_index else (params.seed + seq_index) % 2**64
        rng = np.random.Generator(np.random.PCG64(seed)) if not params.greedy else None
        suppress = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        bias = params.logit_bias
        allowed = params.allowed_token_ids
        return cls(params=params, rng=rng, suppress_ids=sorted(suppress),
                   bad_words_ids=tuple(tuple(w) for w in bad_words_ids),
                   bias_ids=np.fromiter(bias.keys(), dtype=np.int64, count=len(bias)),
                   bias_values=np.fromiter(bias.values(), dtype=np.float32, count=len(bias)),
                   allowed=None if allowed is None else np.unique(np.asarray(allowed, np.int64)), guide=guide,
                   thinking=thinking)

    @property
    def custom(self) -> bool:
        """logit_bias or allowed_token_ids change the row before anything else."""
        return bool(self.bias_ids.size) or self.allowed is not None

    def guide_finished(self, token: int, goes_on: bool) -> bool:
        """Feed the appended token to the thinking state while the sequence thinks (those tokens never
        reach the guide), else to the guide (and, when the sequence goes on, start its next mask).
        True when the guide ends the sequence ("stop")."""
        th = self.thinking
        if th is not None and th.active:
            th.observe(token)
            return False
        if self.guide is None:
            return False
        return self.guide.ends(token) or self.guide.advance(token, prefetch=goes_on)


def _suppress_stops(row: np.ndarray, seq: Sequence, st: SamplingState) -> None:
    """Before min_tokens outputs exist, EOS and stop ids cannot be chosen."""
    if seq.num_output_tokens < st.params.min_tokens and st.suppress_ids:
        row[st.suppress_ids] = -np.inf


def _apply_penalties(row: np.ndarray, seq: Sequence, prm: SamplingParams) -> None:
    """In place; formulas in SamplingParams' docstring."""
    if prm.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(seq.token_ids, dtype=np.int64))
        vals = row[seen]
        row[seen] = np.where(vals > 0, vals / prm.repetition_penalty, vals * prm.repetition_penalty)
    if prm.presence_penalty != 0.0 or prm.frequency_penalty != 0.0:
        out = np.asarray(seq.output_token_ids, dtype=np.int64)
        if out.size:
            ids, counts = np.unique(out, return_counts=True)
            row[ids] -= prm.presence_penalty + prm.frequency_penalty * counts.astype(row.dtype)


def _ban_bad_words(row: np.ndarray, seq: Sequence, st: SamplingState) -> None:
    """Mask the last token of every bad word whose other tokens end the sequence."""
    for w in st.bad_words_ids:
        k = len(w) - 1
        if k == 0 or tuple(seq.token_ids[-k:]) == w[:-1]:
            row[w[-1]] = -np.inf


def _allow_and_bias(row: np.ndarray, st: SamplingState) -> None:
    """allowed_token_ids: every other token -> -inf; logit_bias: added to its tokens (in place)."""
    if st.allowed is not None:
        keep = row[st.allowed]
        row.fill(-np.inf)
        row[st.allowed] = keep
    if st.bias_ids.size:
        row[st.bias_ids] += st.bias_values  # ids are unique (dict keys)


def _needs_penalties(prm: SamplingParams, st: SamplingState) -> bool:
    return (prm.repetition_penalty != 1.0 or prm.presence_penalty != 0.0 or prm.frequency_penalty != 0.0
            or bool(st.bad_words_ids))


def _filtered_probs(row: np.ndarray, temperature: float, top_k: int, top_p: float,
                    min_p: float = 0.0) -> np.ndarray:
    """Probabilities [V] float64 after temperature, top-k and top-p (nucleus, Holtzman et al. 2019)."""
    x = row.astype(np.float64) / temperature
    if 0 < top_k < x.shape[0]:
        kth = np.partition(x, -top_k)[-top_k]
        x[x < kth] = -np.inf
    x -= x.max()
    p = np.exp(x)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
        cut = int(np.searchsorted(cum, top_p, side="left")) + 1
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:cut]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if min_p > 0.0:
        p = np.where(p >= min_p * p.max(), p, 0.0)
        p /= p.sum()
    return p


class TopLogprobs(list):
    """The top alternatives [(token id, logprob)], most likely first, plus `rank`: the sampled
    token's 1-based rank in the whole vocabulary (vLLM's: 1 + the number of tokens with a higher
    logprob), or None when it was not computed. A list, so (logprob, top) unpacks as before."""

    __slots__ = ("rank",)

    def __init__(self, items=(), rank: int | None = None):
        super().__init__(items)
        self.rank = rank


def token_logprobs(row: np.ndarray, token: int, top_n: int, with_rank: bool = False) -> tuple[float, TopLogprobs]:
    """Log-probability of `token` under the model's raw distribution log_softmax(row), and the
    `top_n` most likely (token id, logprob) pairs, most likely first, with the token's rank when
    with_rank. row: [V] fp32 logits."""
    x = row.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    top = TopLogprobs(rank=int(np.count_nonzero(x > x[token])) + 1 if with_rank else None)
    top_n = min(top_n, x.shape[0])
    if top_n > 0:
        idx = np.argpartition(-x, top_n - 1)[:top_n]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        top.extend((int(i), float(x[i] - lse)) for i in idx)
    return float(x[token] - lse), top


def sample(logits: np.ndarray, seqs: list[Sequence], states: list[SamplingState]
           ) -> tuple[np.ndarray, list[tuple[float, list[tuple[int, float]]]]]:
    """logits: [B, V] float32; row i belongs to seqs[i] (its tokens so far, only read) sampled with
    states[i] (its generator advances).

    Returns (token ids [B] int64, logprobs): logprobs[i] is (the chosen token's logprob under the raw
    model distribution, the top params.logprobs (token id, logprob) alternatives as a TopLogprobs
    carrying the sampled token's rank when params.logprobs is set), or (0.0, []) when
    the request asked for no logprobs (a log-softmax over the vocabulary per row is not free)."""
    out = np.empty(len(seqs), dtype=np.int64)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = []
    for i, (seq, st) in enumerate(zip(seqs, states)):
        out[i] = _draw(logits[i], seq, st)
        prm = st.params
        if prm.logprobs is not None or prm.compute_logprobs:
            logprobs.append(token_logprobs(logits[i], int(out[i]), prm.logprobs or 0,
                                           with_rank=prm.logprobs is not None))
        else:
            logprobs.append((0.0, []))
    return out, logprobs


def draw_speculative(raw: np.ndarray, seq: Sequence, st: SamplingState, draft: int | None
                     ) -> tuple[int, bool, tuple[float, list]]:
    """Speculative verify of one position (spec_decode/): (the emitted token, whether it is the
    accepted draft, its logprob entry as `sample` reports it). raw: the position's [V] fp32 logits;
    seq: the sequence with the tokens accepted so far (penalties, bad words and min_tokens read
    them); draft: the proposed token, or None for the bonus position (a plain draw). Greedy: the
    draft is accepted when it is the argmax; sampled: rejection.accept_or_resample on the filtered
    distribution, so the emitted token has that distribution exactly."""
    from paddle_llm_engine.spec_decode.rejection import accept_or_resample

    prm = st.params
    forced = st.thinking.forced_token() if st.thinking is not None else None
    row = _processed_row(raw, seq, st) if forced is None else None
    if forced is not None:
        tok, accepted = forced, draft is not None and forced == draft
    elif prm.greedy:
        tok = int(np.argmax(row))
        accepted = draft is not None and tok == draft
    else:
        p = _filtered_probs(row, prm.temperature, prm.top_k, prm.top_p, prm.min_p)
        if draft is None:
            tok, accepted = _draw_from(p, st.rng), False
        else:
            tok, accepted = accept_or_resample(p, int(draft), st.rng)
    if prm.logprobs is not None or prm.compute_logprobs:
        lp = token_logprobs(raw, tok, prm.logprobs or 0, with_rank=prm.logprobs is not None)
    else:
        lp = (0.0, [])
    return tok, accepted, lp


def _draw_from(p: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(p)
    u = rng.random() * cdf[-1]
    return min(int(np.searchsorted(cdf, u, side="right")), p.shape[0] - 1)


def _processed_row(raw: np.ndarray, seq: Sequence, st: SamplingState) -> np.ndarray:
    """The row after the module docstring's processing up to the guide mask (raw itself when
    nothing applies)."""
    prm = st.params
    row = raw
    if st.custom or seq.num_output_tokens < prm.min_tokens or _needs_penalties(prm, st):
        row = raw.copy()
        if st.custom:
            _allow_and_bias(row, st)
        _suppress_stops(row, seq, st)
        _apply_penalties(row, seq, prm)
        _ban_bad_words(row, seq, st)
    if st.guide is not None and (st.thinking is None or not st.thinking.active):
        row = st.guide.apply(row, raw)
    return row


def _draw(raw: np.ndarray, seq: Sequence, st: SamplingState) -> int:
    """One row's token: the row processed in the module docstring's order, then argmax or a draw."""
    prm = st.params
    if st.thinking is not None:
        forced = st.thinking.forced_token()
        if forced is not None:
            return forced
    row = _processed_row(raw, seq, st)
    if prm.greedy:
        return int(np.argmax(row))
    p = _filtered_probs(row, prm.temperature, prm.top_k, prm.top_p, prm.min_p)
    cdf = np.cumsum(p)
    u = st.rng.random() * cdf[-1]
    return min(int(np.searchsorted(cdf, u, side="right")), p.shape[0] - 1)
