"""RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32 as HF
Llama does (a bf16/fp16 input is upcast, normalized, cast back, then scaled).

Two kernels with one signature; which one an engine uses is the platform layer's decision
(paddle_llm_engine.platforms), made once at start, never by catching an error here:
- rms_norm_composed: plain Paddle ops, runs on every place;
- rms_norm_fused: Paddle's fused kernel (`paddle.incubate.nn.functional.fused_rms_norm`, about 10x
  fewer op launches). Its CPU kernel in Paddle 3.3 executes AVX-512 instructions on any CPU, so it
  must only be chosen where the platform layer verified it. Both agree to ~2e-6 on fp32.
"""

from __future__ import annotations

import paddle

try:
    from paddle.incubate.nn.functional import fused_rms_norm as _fused
except ImportError:  # older Paddle: the platform layer finds no kernel and never picks it
    _fused = None


def rms_norm_composed(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """x: [T, H] (any float dtype), weight: [H] of x's dtype; returns [T, H] in x's dtype."""
    if x.dtype == paddle.float32:
        return x * paddle.rsqrt((x * x).mean(axis=-1, keepdim=True) + eps) * weight
    xf = x.astype("float32")
    return (xf * paddle.rsqrt((xf * xf).mean(axis=-1, keepdim=True) + eps)).astype(x.dtype) * weight


def rms_norm_fused(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """As rms_norm_composed, through Paddle's fused kernel. Raises RuntimeError when this Paddle has
    no fused_rms_norm (the platform layer never selects it then)."""
    if _fused is None:
        raise RuntimeError("this Paddle has no paddle.incubate.nn.functional.fused_rms_norm")
    return _fused(x, weight, None, eps, x.ndim - 1)[0]


# The safe default for callers outside an engine (tests, tools): composed ops.
rms_norm = rms_norm_composed
