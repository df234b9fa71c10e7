"""The speculative-sampling acceptance rule (Leviathan et al. 2023, Chen et al. 2023) for a
deterministic proposer: the draft distribution q is a point mass at the draft token x.

Given the target's filtered distribution p at a position (temperature, top-k, top-p, min-p and
every mask already applied), accept x with probability min(1, p(x) / q(x)) = p(x); on rejection draw
from norm(max(p - q, 0)), which is p with x removed and renormalized. The emitted token then has
exactly the distribution p: P(x) = p(x), P(y != x) = (1 - p(x)) * p(y) / (1 - p(x)) = p(y).
"""

from __future__ import annotations

import numpy as np


def accept_or_resample(p: np.ndarray, draft: int, rng: np.random.Generator) -> tuple[int, bool]:
    """(the emitted token, whether it is the accepted draft). p: [V] float64 probabilities summing
    to 1; draft: the proposed token; rng: the sequence's generator (one or two uniforms used)."""
    px = float(p[draft])
    if px > 0.0 and rng.random() < px:
        return int(draft), True
    rest = p.copy()
    rest[draft] = 0.0
    total = rest.sum()
    if not total > 0.0:  # p was (numerically) a point mass at the draft
        return int(draft), True
    cdf = np.cumsum(rest)
    u = rng.random() * cdf[-1]
    return min(int(np.searchsorted(cdf, u, side="right")), p.shape[0] - 1), False
