"""RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * weight, in fp32 as HF Llama.

Uses Paddle's fused kernel (`paddle.incubate.nn.functional.fused_rms_norm`, registered on CPU in
Paddle 3.3; about 10x fewer op launches than the composed form) and falls back to composed ops
where it is missing; both agree to ~2e-6 on fp32.
"""

from __future__ import annotations

import paddle

try:
    from paddle.incubate.nn.functional import fused_rms_norm as _fused
except ImportError:  # older Paddle
    _fused = None
_use_fused = _fused is not None


def _composed(x, weight, eps):
    return x * paddle.rsqrt((x * x).mean(axis=-1, keepdim=True) + eps) * weight


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """x: [T, H] fp32, weight: [H]; returns [T, H]."""
    global _use_fused
    if _use_fused:
        try:
            return _fused(x, weight, None, eps, x.ndim - 1)[0]
        except Exception:  # kernel not registered for this place: compose from then on
            _use_fused = False
    return _composed(x, weight, eps)
