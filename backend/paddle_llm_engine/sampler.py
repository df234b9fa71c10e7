"""Turn the last-position logits of each sampled sequence into its next token.

Runs on host memory in numpy: one [B, V] copy per step, after which every row is processed with
its own parameters and its own RNG (a request's draws never depend on its batch mates).
Order of processing (HF `generate` / vLLM): allowed_token_ids mask and logit_bias (vLLM applies
them first) -> min_tokens mask -> repetition, presence and frequency
penalties -> guided-decoding mask (guided.py; computed off this path) -> temperature -> top-k ->
top-p -> min-p -> draw. Penalties and the guide also apply to greedy rows.
"""

from __future__ import annotations

import numpy as np

from paddle_llm_engine.sequence import Sequence


def _suppress_stops(row: np.ndarray, seq: Sequence) -> None:
    """Before min_tokens outputs exist, EOS and stop ids cannot be chosen."""
    if seq.num_output_tokens < seq.params.min_tokens:
        ids = list(seq.stop_token_ids | (frozenset() if seq.params.ignore_eos else seq.eos_token_ids))
        if ids:
            row[ids] = -np.inf


def _apply_penalties(row: np.ndarray, seq: Sequence) -> None:
    """In place; formulas in SamplingParams' docstring."""
    prm = seq.params
    if prm.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(seq.token_ids, dtype=np.int64))
        vals = row[seen]
        row[seen] = np.where(vals > 0, vals / prm.repetition_penalty, vals * prm.repetition_penalty)
    if prm.presence_penalty != 0.0 or prm.frequency_penalty != 0.0:
        out = np.asarray(seq.output_token_ids, dtype=np.int64)
        if out.size:
            ids, counts = np.unique(out, return_counts=True)
            row[ids] -= prm.presence_penalty + prm.frequency_penalty * counts.astype(row.dtype)


def _ban_bad_words(row: np.ndarray, seq: Sequence) -> None:
    """Mask the last token of every bad word whose other tokens end the sequence."""
    for w in seq.params.bad_words_ids:
        k = len(w) - 1
        if k == 0 or seq.token_ids[-k:] == w[:-1]:
            row[w[-1]] = -np.inf


def _bias_arrays(prm) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(logit_bias ids, biases, allowed ids) as arrays, built on the request's first step and kept on
    its params: the per-step work is two vectorised index operations."""
    cached = getattr(prm, "_sampler_arrays", None)
    if cached is None:
        ids = np.fromiter(prm.logit_bias.keys(), dtype=np.int64, count=len(prm.logit_bias))
        vals = np.fromiter(prm.logit_bias.values(), dtype=np.float32, count=len(prm.logit_bias))
        allowed = None if prm.allowed_token_ids is None else np.unique(np.asarray(prm.allowed_token_ids, np.int64))
        cached = (ids, vals, allowed)
        prm._sampler_arrays = cached  # not a dataclass field: equality and repr ignore it
    return cached


def _allow_and_bias(row: np.ndarray, prm) -> None:
    """allowed_token_ids: every other token -> -inf; logit_bias: added to its tokens (in place)."""
    ids, vals, allowed = _bias_arrays(prm)
    if allowed is not None:
        keep = row[allowed]
        row.fill(-np.inf)
        row[allowed] = keep
    if ids.size:
        row[ids] += vals  # ids are unique (dict keys)


def _needs_penalties(seq: Sequence) -> bool:
    prm = seq.params
    return (prm.repetition_penalty != 1.0 or prm.presence_penalty != 0.0 or prm.frequency_penalty != 0.0
            or bool(prm.bad_words_ids))


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


def sample(logits: np.ndarray, seqs: list[Sequence]) -> tuple[np.ndarray, list[tuple[float, list[tuple[int, float]]]]]:
    """logits: [B, V] float32 (row i belongs to seqs[i]; the sequences are only read).

    Returns (token ids [B] int64, logprobs): logprobs[i] is (the chosen token's logprob under the raw
    model distribution, the top params.logprobs (token id, logprob) alternatives as a TopLogprobs
    carrying the sampled token's rank when params.logprobs is set), or (0.0, []) when
    the request asked for no logprobs (a log-softmax over the vocabulary per row is not free)."""
    out = np.empty(len(seqs), dtype=np.int64)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = []
    for i, seq in enumerate(seqs):
        row = logits[i]
        prm = seq.params
        custom = bool(prm.logit_bias) or prm.allowed_token_ids is not None
        if custom or seq.num_output_tokens < prm.min_tokens or _needs_penalties(seq):
            row = row.copy()
            if custom:
                _allow_and_bias(row, prm)
            _suppress_stops(row, seq)
            _apply_penalties(row, seq)
            _ban_bad_words(row, seq)
        if seq.guide is not None:  # guided decoding: only the tokens the guide allows (mask built ahead)
            row = seq.guide.apply(row, logits[i])
        if prm.greedy:
            out[i] = int(np.argmax(row))
        else:
            p = _filtered_probs(row, prm.temperature, prm.top_k, prm.top_p, prm.min_p)
            cdf = np.cumsum(p)
            u = seq.rng.random() * cdf[-1]
            out[i] = min(int(np.searchsorted(cdf, u, side="right")), p.shape[0] - 1)
        if prm.logprobs is not None or prm.compute_logprobs:
            logprobs.append(token_logprobs(logits[i], int(out[i]), prm.logprobs or 0,
                                           with_rank=prm.logprobs is not None))
        else:
            logprobs.append((0.0, []))
    return out, logprobs
