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
    y = gemv_lanes_reference(x, np.asarray(q).astype(np.float32), fused) * np.asarray(scale, np.float32)[None, :]
    if bias is not None:
        y = y + np.asarray(bias, np.float32)[None, :]
    return y.astype(np.float32)


def gemv_lanes_reference(x: np.ndarray, qf: np.ndarray, fused: bool) -> np.ndarray:
    """sum_k x[b, k] * qf[n, k] in the C++ GEMV's order: 8 lanes over k mod 8 (zero-padded K),
    then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); fused: one rounding per multiply-add."""
    x = np.asarray(x, np.float32)
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
    return (a[..., 0] + a[..., 2]) + (a[..., 1] + a[..., 3])


def dequantize_int4_reference(q: np.ndarray, scale: np.ndarray, k: int) -> np.ndarray:
    """The fp32 [N, k] weight of packed int4 q [N, ceil(k/2)] uint8 (low nibble = even k, two's
    complement) and scale [N, groups]: q[n, j] * scale[n, j // (k // groups)], one fp32 rounding."""
    q = np.asarray(q, np.uint8)
    vals = np.empty((q.shape[0], 2 * q.shape[1]), np.int16)
    vals[:, 0::2], vals[:, 1::2] = q & 0x0F, q >> 4
    vals = np.where(vals >= 8, vals - 16, vals)[:, :k].astype(np.float32)
    scale = np.asarray(scale, np.float32)
    return vals * np.repeat(scale, k // scale.shape[1], axis=1)


def gemv_int4_reference(x: np.ndarray, q: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None,
                        fused: bool = True) -> np.ndarray:
    """numpy model of cpu_kernels.gemv_int4: the dequantized fp32 weight (dequantize_int4_reference)
    summed in the GEMV's order. fused=True (avx2_fma): the product of two fp32 values is exact in
    float64, so float64 add + one rounding equals the FMA except when the float64 sum itself rounds
    onto an fp32 rounding midpoint (about 2^-29 per step; the seeded tests never meet one)."""
    y = gemv_lanes_reference(x, dequantize_int4_reference(q, scale, np.asarray(x).shape[1]), fused)
    if bias is not None:
        y = y + np.asarray(bias, np.float32)[None, :]
    return y.astype(np.float32)


def gemv_w4a8_reference(x: np.ndarray, q: np.ndarray, scale: np.ndarray, k: int,
                        bias: np.ndarray | None = None) -> np.ndarray:
    """The int4 x int8 GEMV's value in float64: x quantized per row and block of 32 exactly as the
    kernel does (numpy's rint and fp32 division, quantize_activations_numpy's rule), the int4 nibbles
    unpacked (low = even k), exact integer block sums, then sum over blocks of
    sum * xs[b, block] * scale[n, group] in float64 (+ bias). The kernel's fp32 lane order differs
    from this by fp32 rounding only."""
    xf = np.ascontiguousarray(x, np.float32)
    b, blocks = xf.shape[0], k // 32
    xs = (np.abs(xf.reshape(b, blocks, 32)).max(axis=2) / np.float32(127)).astype(np.float32)
    safe = np.where(xs > 0, xs, np.float32(1))
    xq = np.clip(np.rint(xf.reshape(b, blocks, 32) / safe[:, :, None]), -127, 127).astype(np.int64)
    xq[xs == 0] = 0
    lo = (q & 0x0F).astype(np.int64)
    hi = (q >> 4).astype(np.int64)
    qi = np.empty((q.shape[0], k), np.int64)
    qi[:, 0::2] = np.where(lo > 7, lo - 16, lo)[:, : (k + 1) // 2]
    qi[:, 1::2] = np.where(hi > 7, hi - 16, hi)[:, : k // 2]
    group = k // scale.shape[1]
    y = np.zeros((b, q.shape[0]))
    for j in range(blocks):
        sums = xq[:, j] @ qi[:, 32 * j:32 * (j + 1)].T
        y += sums * xs[:, j:j + 1].astype(np.float64) * scale[:, (32 * j) // group][None, :].astype(np.float64)
    return y if bias is None else y + bias.astype(np.float64)
