"""Linear layers as the engine's OpSet stores and runs them: one class per kernel, one interface.

A model hands every Linear weight over once, at load, as the fp32 numpy matrix [in, out] that
`x @ W` expects (plus an optional bias [out]); the OpSet's `make_linear` keeps it in the layout its
kernel reads and returns a callable `lin(x [T, in]) -> [T, out]`:
- ComposedLinear: paddle.matmul on [in, out] in the compute dtype (every place);
- GemvLinear: the C++ CPU weight-streaming GEMV on [out, in] fp32 (cpu_kernels.linear; paddle.matmul
  with transpose_y on the same tensor for large batches), one copy of the weight;
- Int8Linear: int8 weights (per-output-channel symmetric, fp32 scales), a quarter of the fp32 bytes
  read per step; on the vector isas (avx512_vnni, avx2_fma) the activations are quantized to int8
  per row in each call and the C++ int8 x int8 GEMV runs (cpu_kernels.linear_w8a8), on "generic"
  the weight-only int8 GEMV with fp32 activations (cpu_kernels.linear_int8);
- Int4Linear: int4 weights (symmetric, one fp32 scale per group of input channels or per output
  channel), an eighth of the fp32 bytes plus scales; on AVX-512 VNNI the activations are quantized
  to int8 per row and block of 32 in each call and the int4 x int8 GEMV runs
  (cpu_kernels.linear_w4a8), elsewhere the weight-only int4 GEMV (cpu_kernels.linear_int4);
- on a GCU, quantized linears are paddle_llm_ops.gcu.linear_quant.GcuQuantLinear (linear_quant_gcu).

Every linear declares in_features / out_features and its `kind`, which names how its weights are
stored, for code that reads them without calling the linear (the CPU decode stack):
"composed" (weight [in, out] in the compute dtype), "fp32" (weight [out, in] fp32), "int8" and
"w8a8" (qweight [out, in] int8, scale [out] fp32; w8a8 quantizes activations to int8 per call),
"int4" and "w4a8" (qweight [out, ceil(in/2)] uint8, scale [out, groups] fp32; w4a8 quantizes
activations to int8 per call), "linear_quant_gcu".
"""

from __future__ import annotations

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy


def _const(t: paddle.Tensor) -> paddle.Tensor:
    t.stop_gradient = True
    return t


def _bias(bias: np.ndarray | None, dtype: str) -> paddle.Tensor | None:
    if bias is None:
        return None
    t = from_numpy(np.asarray(bias, dtype=np.float32))
    return _const(t if dtype == "float32" else t.astype(dtype))


class ComposedLinear:
    """y = x @ W (+ b) with paddle.matmul. weight [in, out] in the compute dtype."""

    kind = "composed"

    def __init__(self, w_in_out: np.ndarray, bias: np.ndarray | None, dtype: str):
        t = from_numpy(np.ascontiguousarray(w_in_out, dtype=np.float32))
        self.in_features, self.out_features = t.shape
        self.weight = _const(t if dtype == "float32" else t.astype(dtype))
        self.bias = _bias(bias, dtype)

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        y = paddle.matmul(x, self.weight)
        return y if self.bias is None else y + self.bias


class GemvLinear:
    """y = x @ W (+ b) through cpu_kernels.linear; weight stored [out, in] fp32 (transposed once at
    load). isa: the dispatch path the platform layer chose ("avx2_fma" | "generic")."""

    kind = "fp32"

    def __init__(self, w_in_out: np.ndarray, bias: np.ndarray | None, isa: str):
        self.weight = _const(from_numpy(np.ascontiguousarray(np.asarray(w_in_out, np.float32).T)))
        self.out_features, self.in_features = self.weight.shape
        self.bias = _bias(bias, "float32")
        self.isa = isa

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        from paddle_llm_ops import cpu_kernels

        return cpu_kernels.linear(x, self.weight, self.bias, self.isa)


class Int8Linear:
    """int8 weights: q [out, in] int8 and scale [out] fp32 with scale = max|W[:, o]| / 127 and
    q = round(W / scale) (cpu_kernels.quantize_int8_numpy), so |W - q * scale| <= scale / 2 per weight.

    activations: "int8" quantizes x per row (cpu_kernels.W8A8_GROUP) in each call and multiplies
    int8 x int8 (cpu_kernels.linear_w8a8: llama.cpp's Q8_0 scheme, AVX-512 VNNI or AVX2); "fp32"
    keeps x in fp32 (cpu_kernels.linear_int8, the weight-only GEMV: int8 widened to fp32); None (the
    default) picks "int8" on the isas of cpu_kernels.W8A8_ISAS and "fp32" on "generic". Both use the
    same stored weights; above cpu_kernels.GEMV_INT8_MAX_BATCH rows (prefill) both multiply fp32
    activations by the dequantized weight, unless int8_prefill (with int8 activations on
    "avx512_vnni": the int8 GEMM takes every row count). kind: "w8a8" with int8 activations, else
    "int8". Raises ValueError for another activations value, or int8_prefill elsewhere."""

    def __init__(self, w_in_out: np.ndarray, bias: np.ndarray | None, isa: str, activations: str | None = None,
                 int8_prefill: bool = False):
        from paddle_llm_ops import cpu_kernels

        if activations is None:
            activations = "int8" if isa in cpu_kernels.W8A8_ISAS else "fp32"
        if activations not in ("int8", "fp32"):
            raise ValueError(f"Int8Linear activations must be 'int8' or 'fp32', got {activations!r}")
        q, scale = cpu_kernels.quantize_int8_numpy(np.asarray(w_in_out, np.float32).T)
        self.qweight, self.scale = _const(from_numpy(q)), _const(from_numpy(scale))
        self.out_features, self.in_features = q.shape
        self.bias = _bias(bias, "float32")
        self.isa = isa
        self.activations = activations
        self.kind = "w8a8" if activations == "int8" else "int8"
        if int8_prefill and (activations != "int8" or isa != "avx512_vnni"):
            raise ValueError("Int8Linear int8_prefill needs int8 activations on avx512_vnni (the int8 GEMM)")
        self.int8_prefill = bool(int8_prefill)

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        from paddle_llm_ops import cpu_kernels

        if self.activations == "int8":
            return cpu_kernels.linear_w8a8(x, self.qweight, self.scale, self.bias, self.isa, cpu_kernels.W8A8_GROUP,
                                           self.int8_prefill)
        return cpu_kernels.linear_int8(x, self.qweight, self.scale, self.bias, self.isa)


def group_size_for(in_width: int, group_size: int) -> int:
    """The group size a linear of input width in_width uses: in_width for -1 (one group per output
    channel), else group_size. Raises ValueError naming the setting when group_size does not divide
    in_width or, for groups, is not a multiple of 8 (the int4 GEMV reads 8 weights per scale)."""
    if group_size == -1:
        return in_width
    if group_size <= 0 or group_size % 8 or in_width % group_size:
        raise ValueError(f"quantization_group_size {group_size} does not fit a linear of input width {in_width} of "
                         f"this model (with tensor_parallel_size > 1: of a rank's shard): use -1 (per output channel) "
                         f"or a multiple of 8 dividing every linear's input width")
    return group_size


class Int4Linear:
    """int4 weights: q [out, ceil(in/2)] uint8 (two signed nibbles per byte) and scale [out, in / G]
    fp32 with scale = max|W[group, o]| / 7 and q = round(W / scale) in [-7, 7]
    (cpu_kernels.quantize_int4_numpy), so |W - q * scale| <= scale / 2 per weight. group_size: -1
    (G = in: per output channel) or G dividing in (a multiple of 8); ValueError naming
    quantization_group_size otherwise.

    activations: "int8" quantizes x per row and block of 32 in each call and multiplies int4 x int8
    (cpu_kernels.linear_w4a8: AVX-512 VNNI); "fp32" keeps x in fp32 (cpu_kernels.linear_int4: the
    nibbles widened to fp32); None (the default) picks "int8" on the isas of cpu_kernels.W4A8_ISAS
    when in and G are multiples of 32, else "fp32". Above GEMV_INT4_MAX_BATCH rows (prefill) both
    multiply fp32 activations by the dequantized weight. kind: "w4a8" with int8 activations, else
    "int4". Raises ValueError for another activations value, or "int8" where it cannot run."""

    def __init__(self, w_in_out: np.ndarray, bias: np.ndarray | None, isa: str, group_size: int,
                 activations: str | None = None):
        from paddle_llm_ops import cpu_kernels

        w = np.asarray(w_in_out, np.float32).T
        g = group_size_for(w.shape[1], group_size)
        fits = isa in cpu_kernels.W4A8_ISAS and w.shape[1] % 32 == 0 and g % 32 == 0
        if activations is None:
            activations = "int8" if fits else "fp32"
        if activations not in ("int8", "fp32"):
            raise ValueError(f"Int4Linear activations must be 'int8' or 'fp32', got {activations!r}")
        if activations == "int8" and not fits:
            raise ValueError(f"Int4Linear activations 'int8' needs isa in {cpu_kernels.W4A8_ISAS} and an input width "
                             f"and group size that are multiples of 32, got isa {isa!r}, width {w.shape[1]}, group {g}")
        q, scale = cpu_kernels.quantize_int4_numpy(w, g)
        self.qweight, self.scale = _const(from_numpy(q)), _const(from_numpy(scale))
        self.out_features, self.in_features = w.shape
        self.bias = _bias(bias, "float32")
        self.isa = isa
        self.activations = activations
        self.kind = "w4a8" if activations == "int8" else "int4"

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        from paddle_llm_ops import cpu_kernels

        if self.activations == "int8":
            return cpu_kernels.linear_w4a8(x, self.qweight, self.scale, self.bias, self.isa)
        return cpu_kernels.linear_int4(x, self.qweight, self.scale, self.bias, self.isa)
