"""Quantization for the C++ CPU kernels' int8 / int4 GEMVs: the weights (numpy at load, or the C++
op) and the activations of the int8 x int8 GEMV (the kernel's own step as an op, and its numpy twin).
Every numpy function gives the same bits as its C++ counterpart."""

from __future__ import annotations

import numpy as np
import paddle

from paddle_llm_ops.cpu_kernels import _run
from paddle_llm_ops.host_tensor import from_numpy


def quantize_activations_int8(x: paddle.Tensor, group: int = 0) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The activation step of gemv_w8a8, as its own op: x [B, K] fp32 -> (xq [B, K] int8,
    xs [B, groups] fp32), groups = ceil(K / group) (1 for group 0). Raises ValueError as gemv_w8a8."""
    xq, xs = _run("plk_quantize_act_int8", x, int(group))
    return xq, xs


def quantize_activations_numpy(x: np.ndarray, group: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """numpy version of quantize_activations_int8 (same bits): per row b and group g of `group`
    input channels (0: the whole row), xs = max |x| / 127 (fp32), xq = clip(rint(x / xs), -127, 127)
    (fp32 division; an all-zero group gets xs 0 and xq 0)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    b, k = x.shape
    g = k if group <= 0 or group >= k else int(group)
    groups = -(-k // g)
    xq = np.zeros((b, k), np.int8)
    xs = np.zeros((b, groups), np.float32)
    for j in range(groups):
        part = x[:, j * g:(j + 1) * g]
        s = (np.abs(part).max(axis=1) / np.float32(127)).astype(np.float32)
        safe = np.where(s > 0, s, np.float32(1))[:, None]
        qj = np.clip(np.rint(part / safe), -127, 127).astype(np.int8)
        qj[s == 0] = 0
        xq[:, j * g:(j + 1) * g], xs[:, j] = qj, s
    return xq, xs


def quantize_int8_numpy(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel symmetric int8 of an fp32 [N, K] weight (rows = output channels):
    scale[n] = max_k |w[n, k]| / 127 (fp32), q = round-half-even(w / scale) clipped to [-127, 127]
    (fp32 division); an all-zero row gets scale 0 and q 0. Returns (q int8 [N, K], scale fp32 [N]).
    Bit-identical to the C++ `quantize_int8`. Rounding error per weight <= scale / 2."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_int8 needs a 2-D [N, K] weight, got shape {w.shape}")
    scale = (np.abs(w).max(axis=1) / np.float32(127)).astype(np.float32)
    q = np.empty(w.shape, dtype=np.int8)
    safe = np.where(scale > 0, scale, np.float32(1))[:, None]
    step = max(1, (1 << 24) // max(1, w.shape[1]))  # rows per chunk: bounded temporaries
    for i in range(0, w.shape[0], step):
        r = np.rint(w[i:i + step] / safe[i:i + step])
        q[i:i + step] = np.clip(r, -127, 127).astype(np.int8)
    q[scale == 0] = 0
    return q, scale


def quantize_int8(w) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Quantize an fp32 [N, K] weight (paddle.Tensor or numpy array) for gemv_int8.
    Returns (q [N, K] int8, scale [N] fp32) as CPU tensors; see quantize_int8_numpy for the math.
    A paddle.Tensor runs the C++ op (threaded), numpy the numpy version; both give the same bits."""
    if isinstance(w, np.ndarray):
        q, s = quantize_int8_numpy(w)
        return from_numpy(q), from_numpy(s)
    q, s = _run("plk_quantize_int8", w)
    return q, s


def quantize_int4_numpy(w: np.ndarray, group_size: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 of an fp32 [N, K] weight (rows = output channels), one scale per group of
    group_size consecutive k of a row (-1: one group per row, i.e. per output channel).

    scale[n, g] = max |w[n, g*G:(g+1)*G]| / 7 (fp32), q = round-half-even(w / scale) clipped to
    [-7, 7] (fp32 division; an all-zero group gets scale 0 and q 0). Packed two per byte, k even in
    the low nibble, two's complement: q_packed [N, ceil(K / 2)] uint8. Returns (q_packed, scale
    fp32 [N, K / G]). Rounding error per weight <= scale / 2. Raises ValueError when group_size is
    not -1 or a positive multiple of 8 dividing K (the GEMV reads 8 weights per scale)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_int4 needs a 2-D [N, K] weight, got shape {w.shape}")
    n, k = w.shape
    g = k if group_size == -1 else int(group_size)
    if g <= 0 or k % g or (g != k and g % 8):
        raise ValueError(f"group_size {group_size} must be -1 or a positive multiple of 8 dividing K = {k}")
    groups = w.reshape(n, k // g, g)
    scale = (np.abs(groups).max(axis=2) / np.float32(7)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))[:, :, None]
    q = np.clip(np.rint(groups / safe), -7, 7).astype(np.int8)
    q[scale == 0] = 0
    q = q.reshape(n, k)
    if k % 2:
        q = np.concatenate([q, np.zeros((n, 1), np.int8)], axis=1)
    nib = q.view(np.uint8) & np.uint8(0x0F)
    return np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4))), scale
