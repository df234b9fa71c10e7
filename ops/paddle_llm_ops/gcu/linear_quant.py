"""Weight-only int8 / int4 linears on a GCU through paddle-custom-gcu's `linear_quant_gcu`.

What the real sources say (read 2026-12 with the search tool; PaddleCustomDevice
backends/gcu/custom_op/llm/linear_quant_op.cc, .../custom_op/llm/weight_quantize_op.cc,
backends/gcu/kernels/weight_quantize_kernel.cc, custom_op/api/custom_ops_api.py; FastDeploy
fastdeploy/model_executor/layers/backends/gcu/quantization/weight_only.py):

- The op: `linear_quant_gcu(lhs, rhs, scale, Optional bias; group_size: int) -> linear_out`, a thin
  call of TopsATen's `topsatenLinearQuant(out, lhs, rhs, bias, scale, group_size)` (closed source).
  Output dtype = lhs dtype; its last dim is rhs.shape[-1] when lhs's K == rhs.shape[0], else
  rhs.shape[0] (FastDeploy's rhs is always [N, ...], so the second case).
- FastDeploy quantizes at load with `weight_quantize_rtn(w [K, N] in bf16/fp16, algo, group_size)`:
  weight_only_int8 is renamed "llm.int8" and both go through `paddle._C_ops.weight_quantize(w,
  algo, 80, group_size)`, which on a gcu place is the plug-in's own phi kernel (it copies to host and
  quantizes there): scale = max|w| / bound over a column (per channel: scale [N]) or over a group of
  group_size consecutive k of a column (scale [K / group_size, N]); bound 127 (int8) or 7 (int4);
  q = std::round(w / scale) (half away from zero) clipped to [-bound, bound].
  * int8: rhs = q transposed, int8 [N, K] (row n = output channel n, k contiguous).
  * int4: the kernel stores nibble = q + 8 (offset binary, 1..15) two per byte along N, giving
    [N/2, K]; `rearrange_for_w4a16` then unpacks it, pads K with zero nibbles up to a multiple of
    128 (Kp) and repacks along K in blocks of 128: rhs uint8 [N, Kp / 2] with
    byte [n, 64 b + j] = nib[n, 128 b + j] | nib[n, 128 b + 64 + j] << 4  (j < 64).
  * the scale is cast to the model dtype (layer.weight_scale, default dtype) before the call.
- Ours differs in one point: the scale is rounded to the model dtype first and q = round(w / that
  stored scale) (FastDeploy divides by the fp32 scale and rounds the scale afterwards), so in bf16 /
  fp16 a q can differ by one step from FastDeploy's; in fp32 the bytes are the wheel's.
- FastDeploy's GCU linear always passes group_size -1 (per channel); weight_quantize_rtn accepts
  -1, 64 and 128 (its assert); vllm-gcu documents 4-bit groups of 64 or multiples of 64. This
  engine allows -1, 64 and 128 on a GCU (the plan refuses others) and defaults wint4 to 64.
How sure: the call, the shapes, int8's layout and the int4 repacking are read from the code above
(high confidence). Whether TopsATen reads the int4 nibble as offset binary (q + 8, what the plug-in's
quantizer writes) is inferred from that quantizer, not from the closed kernel (medium confidence);
the numerical check "gcu_linear_quant" (paddle_llm_ops.kernel_checks.gcu) tells on a real GCU: a kernel that
reads the nibbles or the groups another way fails it and the plan refuses the quantization.
"""

from __future__ import annotations

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy

GCU_GROUP_SIZES = (-1, 64, 128)
_BOUND = {8: 127, 4: 7}
_K_BLOCK = 128  # rearrange_for_w4a16 pads K to a multiple of this and interleaves halves of 64
_SQUARE_PAD = 16  # zero output channels added to a square int4 weight (GcuQuantLinear)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _rounded_scale(scale: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 scale as stored in `dtype` (the op reads the scale in the model dtype), back as fp32."""
    if dtype == "float32":
        return scale.astype(np.float32)
    return paddle.to_tensor(scale.astype(np.float32), place=paddle.CPUPlace()).astype(dtype).astype("float32").numpy()


def quantize_for_linear_quant(w_in_out: np.ndarray, bits: int, group_size: int,
                              scale_dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """(rhs, scale) in the layout linear_quant_gcu reads (module docstring) from an fp32 [K, N] weight.

    bits 8: rhs int8 [N, K]; bits 4: rhs uint8 [N, Kp / 2] (Kp = K rounded up to 128, offset-binary
    nibbles, 64-interleaved). scale fp32 [N] (group_size -1) or [K / group_size, N], its values already
    rounded to scale_dtype (quantization divides by the stored scale). Raises ValueError for bits other
    than 4 / 8 or a group size that does not divide K."""
    if bits not in _BOUND:
        raise ValueError(f"linear_quant_gcu takes 8 or 4 bit weights, got {bits}")
    w = np.ascontiguousarray(w_in_out, np.float32)
    k, n = w.shape
    g = k if group_size == -1 else group_size
    if g <= 0 or k % g:
        raise ValueError(f"quantization_group_size {group_size} does not divide the linear's input width {k}")
    groups = w.reshape(k // g, g, n)
    scale = _rounded_scale(np.abs(groups).max(axis=1) / np.float32(_BOUND[bits]), scale_dtype)  # [K/g, N]
    safe = np.where(scale > 0, scale, np.float32(1))[:, None, :]
    q = np.clip(_round_half_away(groups / safe), -_BOUND[bits], _BOUND[bits]).astype(np.int8)
    q[np.broadcast_to((scale == 0)[:, None, :], q.shape)] = 0
    q = q.reshape(k, n)
    scale = scale[0] if group_size == -1 else scale
    if bits == 8:
        return np.ascontiguousarray(q.T), scale
    kp = -(-k // _K_BLOCK) * _K_BLOCK
    nib = np.zeros((kp, n), np.uint8)
    nib[:k] = (q + 8).astype(np.uint8)
    nib = nib.reshape(kp // _K_BLOCK, 2, _K_BLOCK // 2, n)  # [block, half, j, n]
    packed = nib[:, 0] | (nib[:, 1] << np.uint8(4))  # [block, j, n]
    return np.ascontiguousarray(packed.reshape(kp // 2, n).T), scale


def dequantize_linear_quant(rhs: np.ndarray, scale: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The fp32 [K, N] weight that (rhs, scale) of quantize_for_linear_quant stand for (the reference
    the kernel is checked against): q * scale of its group, padding dropped."""
    scale = np.asarray(scale, np.float32)
    if bits == 8:
        q = np.asarray(rhs, np.int8).T.astype(np.float32)  # [K, N]
    else:
        r = np.asarray(rhs, np.uint8)
        n, half = r.shape
        blocks = r.T.reshape(half // (_K_BLOCK // 2), _K_BLOCK // 2, n)
        nib = np.stack([blocks & 0x0F, blocks >> 4], axis=1).reshape(2 * half, n)
        q = nib[:k].astype(np.float32) - 8
    per_k = scale[None, :] if scale.ndim == 1 else np.repeat(scale, k // scale.shape[0], axis=0)
    return q * per_k


class GcuQuantLinear:
    """y = x @ W (+ b) with W stored weight-only quantized for linear_quant_gcu (bits 8 or 4,
    group_size -1 or a divisor of the input width; layout in the module docstring), scale and bias in
    the compute dtype. x: [T, K] in dtype on the GCU; returns [T, N] in dtype."""

    kind = "linear_quant_gcu"

    def __init__(self, w_in_out: np.ndarray, bias: np.ndarray | None, dtype: str, bits: int, group_size: int):
        w = np.asarray(w_in_out, np.float32)
        k, n = w.shape
        self.bits, self.group_size, self.in_features, self.out_features = bits, int(group_size), int(k), int(n)
        # The op sizes its output as rhs.shape[-1] when lhs's K equals rhs.shape[0]: for a square int4
        # weight (rhs [N, Kp / 2] with N == K) that is Kp / 2, not N. Zero output channels appended
        # until N' != K make it take rhs.shape[0] = N'; the extra columns are dropped after the call.
        pad = _SQUARE_PAD if bits == 4 and k == n else 0
        if pad:
            w = np.concatenate([w, np.zeros((k, pad), np.float32)], axis=1)
            bias = None if bias is None else np.concatenate([np.asarray(bias, np.float32), np.zeros(pad, np.float32)])
        self.padded_out = pad
        rhs, scale = quantize_for_linear_quant(w, bits, group_size, dtype)
        self.qweight = _const(from_numpy(rhs))
        self.scale = _const(_in_dtype(scale, dtype))
        self.bias = None if bias is None else _const(_in_dtype(np.asarray(bias, np.float32), dtype))

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        from paddle.base import core

        out = core.eager._run_custom_op("linear_quant_gcu", x, self.qweight, self.scale, self.bias, self.group_size)
        out = out[0] if isinstance(out, (list, tuple)) else out
        return out[..., :self.out_features] if self.padded_out else out


def _const(t: paddle.Tensor) -> paddle.Tensor:
    t.stop_gradient = True
    return t


def _in_dtype(a: np.ndarray, dtype: str) -> paddle.Tensor:
    t = from_numpy(a)
    return t if dtype == "float32" else t.astype(dtype)
