"""numpy models of the C++ CPU kernels' arithmetic, for bit-exact comparisons in test_cpu_kernels.py
(test code: the product module paddle_llm_ops.cpu_kernels holds only what the engine runs)."""

from __future__ import annotations

import numpy as np


def gemv_int8_reference(x: np.ndarray, q: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None,
                        fused: bool = True) -> np.ndarray:
    """numpy model of cpu_kernels.gemv_int8's arithmetic, summation order included (tests compare bit for bit).
    fused=True models the avx2_fma path (one rounding per multiply-add: the product of an fp32 and
    an int8 is exact in float64, so float64 add + one rounding to fp32 equals the FMA unless the
    float64 sum itself rounds, which needs operands ~2^29 apart), fused=False the generic path."""
    x = np.asarray(x, np.float32)
    qf = np.asarray(q).astype(np.float32)
    b, k = x.shape
    n = qf.shape[0]
    kp = -(-k // 8) * 8
    xp = np.zeros((b, kp), np.float32)
    xp[:, :k] = x
    qp = np.zeros((n, kp), np.float32)
    qp[:, :k] = qf
    xr, qr = xp.reshape(b, kp // 8, 8), qp.reshape(n, kp // 8, 8)
    acc = np.zeros((b, n, 8), np.float32)
    for t in range(kp // 8):
        xt, qt = xr[:, None, t, :], qr[None, :, t, :]
        if fused:
            acc = (xt.astype(np.float64) * qt.astype(np.float64) + acc.astype(np.float64)).astype(np.float32)
        else:
            acc = acc + xt * qt
    a = acc[..., :4] + acc[..., 4:]
    s = (a[..., 0] + a[..., 2]) + (a[..., 1] + a[..., 3])
    y = s * np.asarray(scale, np.float32)[None, :]
    if bias is not None:
        y = y + np.asarray(bias, np.float32)[None, :]
    return y.astype(np.float32)
