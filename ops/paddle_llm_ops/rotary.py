"""Rotary position embedding (Su et al. 2021, RoFormer), the rotate-half form HF Llama uses.

Two pairings of a head's dims exist: rotate-half (pairs (i, i + d/2); Llama, Qwen) and interleaved
(pairs (2i, 2i+1); GPT-J / GLM style, used by ERNIE 4.5). Only rotate-half is applied at run time:
an interleaved model's q/k projection rows are permuted once at load time with
`interleaved_to_half_order`, which turns its rotary into rotate-half exactly (see that function).
"""

from __future__ import annotations

import math

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _rope_inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> tuple[np.ndarray, float]:
    """(inverse frequencies [head_dim // 2] float64, attention factor for cos/sin), HF `rope_scaling` applied.

    Supported rope_type: default / None, "linear" (positions / factor), "llama3" (Meta's
    wavelength-dependent smoothing, transformers' `_compute_llama3_parameters`), "yarn" (Peng et al.
    2023, transformers' `_compute_yarn_parameters`: blended inverse frequencies, cos/sin scaled by
    the attention factor). Raises ValueError for any other rope_type (e.g. "dynamic", whose
    frequencies change with the sequence length, or "longrope") and for partial rotary, never
    silently ignoring them.
    """
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if not scaling:
        return inv, 1.0
    partial = float(scaling.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor {partial} is not supported (only full-dim rotary)")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(scaling["factor"]), 1.0
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wl, high_wl = old_ctx / low, old_ctx / high
        wl = 2 * math.pi / inv
        scaled = np.where(wl > low_wl, inv / factor, inv)
        smooth = (old_ctx / wl - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wl >= high_wl) & (wl <= low_wl)
        return np.where(is_mid, mid, scaled), 1.0
    if kind == "yarn":
        return _yarn(inv, head_dim, theta, scaling)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")


def _yarn(inv: np.ndarray, dim: int, theta: float, s: dict) -> tuple[np.ndarray, float]:
    if s.get("factor") is None or s.get("original_max_position_embeddings") is None:
        raise ValueError("rope_scaling yarn needs 'factor' and 'original_max_position_embeddings'")
    factor = float(s["factor"])
    old_ctx = float(s["original_max_position_embeddings"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = s.get("attention_factor")
    if attn is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = float(s.get("beta_fast") or 32)
    beta_slow = float(s.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as HF: avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency, 0: interpolate (divide by factor)
    return inv / factor * (1 - extrapolation) + inv * extrapolation, float(attn)


def interleaved_to_half_order(head_dim: int) -> np.ndarray:
    """Permutation p of a head's dims, [0, 2, 4, ..., 1, 3, 5, ...], turning interleaved rotary into
    rotate-half: for y = x[p], rotate_half_rope(y) == interleaved_rope(x)[p] (pair (2i, 2i+1) of x
    becomes pair (i, i + d/2) of y, with the same frequency i). Applying p to the rows of each q and
    k head (weights, biases, per-head norm weights) therefore leaves every q.k score unchanged while
    the model runs the ordinary rotate-half kernel; v and the output are untouched."""
    if head_dim % 2:
        raise ValueError(f"rotary needs an even head_dim, got {head_dim}")
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


class RotaryTable:
    """Precomputed cos/sin for positions [0, max_positions): each [max_positions, head_dim] fp32
    (already multiplied by the rope type's attention factor, 1 except for yarn)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None = None):
        inv, attn_factor = _rope_inverse_frequencies(head_dim, theta, scaling)
        freqs = np.outer(np.arange(max_positions, dtype=np.float64), inv)
        emb = np.concatenate([freqs, freqs], axis=-1)
        self.cos = from_numpy((np.cos(emb) * attn_factor).astype(np.float32))
        self.sin = from_numpy((np.sin(emb) * attn_factor).astype(np.float32))

    def cos_sin_table(self, dtype: str = "float32") -> paddle.Tensor:
        """[max_positions, head_dim] in `dtype`: the cos of the head_dim/2 frequencies, then their sin
        (paddle-custom-gcu's fused_rotary_embedding_gcu table, rotate-half form). Made once per dtype."""
        cache = self.__dict__.setdefault("_cos_sin", {})
        if dtype not in cache:
            half = self.cos.shape[-1] // 2
            t = paddle.concat([self.cos[:, :half], self.sin[:, :half]], axis=-1)
            cache[dtype] = t if dtype == "float32" else t.astype(dtype)
        return cache[dtype]

    def lookup(self, positions: paddle.Tensor):
        """positions: [T] int64 -> (cos, sin), each [T, 1, head_dim] for broadcasting over heads."""
        cos = paddle.index_select(self.cos, positions, axis=0).unsqueeze(1)
        sin = paddle.index_select(self.sin, positions, axis=0).unsqueeze(1)
        return cos, sin


def apply_rotary(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
    """x: [T, heads, head_dim]; returns x*cos + rotate_half(x)*sin (same shape)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = paddle.concat([-x2, x1], axis=-1)
    return x * cos + rotated * sin
