"""Rotary position embedding (Su et al. 2021, RoFormer), the rotate-half form HF Llama uses."""

from __future__ import annotations

import math

import numpy as np
import paddle


def _inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """Inverse frequencies [head_dim // 2] (float64), with HF's `rope_scaling` variants applied.

    Supported rope_type: default / None, "linear" (positions / factor), "llama3" (Meta's
    wavelength-dependent smoothing, as in transformers' `_compute_llama3_parameters`).
    Raises ValueError for any other rope_type, never silently ignoring it.
    """
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
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
        return np.where(is_mid, mid, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)")


class RotaryTable:
    """Precomputed cos/sin for positions [0, max_positions): each [max_positions, head_dim] fp32."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None = None):
        inv = _inv_freq(head_dim, theta, scaling)
        freqs = np.outer(np.arange(max_positions, dtype=np.float64), inv)
        emb = np.concatenate([freqs, freqs], axis=-1)
        self.cos = paddle.to_tensor(np.cos(emb).astype(np.float32))
        self.sin = paddle.to_tensor(np.sin(emb).astype(np.float32))
        self.max_positions = max_positions

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
