"""Turn the last-position logits of each sampled sequence into its next token.

Runs on host memory in numpy: one [B, V] copy per step, after which every row is processed with
its own parameters and its own RNG (a request's draws never depend on its batch mates).
Order of processing, as in HF `generate`: min_tokens mask -> temperature -> top-k -> top-p -> draw.
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


def _filtered_probs(row: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
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
    return p


def sample(logits: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
    """logits: [B, V] float32 (row i belongs to seqs[i]). Returns [B] int64 token ids."""
    out = np.empty(len(seqs), dtype=np.int64)
    for i, seq in enumerate(seqs):
        row = logits[i]
        if seq.num_output_tokens < seq.params.min_tokens:
            row = row.copy()
            _suppress_stops(row, seq)
        prm = seq.params
        if prm.greedy:
            out[i] = int(np.argmax(row))
            continue
        p = _filtered_probs(row, prm.temperature, prm.top_k, prm.top_p)
        cdf = np.cumsum(p)
        u = seq.rng.random() * cdf[-1]
        out[i] = min(int(np.searchsorted(cdf, u, side="right")), p.shape[0] - 1)
    return out
