"""The GEMVs of the C++ CPU kernels (see the package docstring for the op table, dispatch and
threads): fp32, weight-only int8, int8 x int8 (w8a8) and weight-only int4, each with a `linear_*`
that hands batches above the kernel's limit to paddle.matmul on the same weight."""

from __future__ import annotations

import paddle

from paddle_llm_ops.cpu_kernels import (GEMV_INT4_MAX_BATCH, GEMV_INT8_MAX_BATCH, GEMV_MAX_BATCH, _resolve, _run,
                                        fp32_gemv_max_batch)


def gemv(x: paddle.Tensor, w: paddle.Tensor, bias: paddle.Tensor | None = None,
         isa: str = "generic") -> paddle.Tensor:
    """y = x @ w^T (+ bias), streaming the weight once per call.

    x: [B, K] fp32 contiguous; w: [N, K] fp32 contiguous (the HF Linear layout "out, in", and the
    layout of a tied embedding); bias: [N] fp32 or None. Returns [B, N] fp32. Any B works; it is
    fastest for decode batches (B <= GEMV_MAX_BATCH; see `linear`). Summation order per output:
    8 lanes over k mod 8, then a fixed lane tree (csrc/gemv.cc), identical on both isas except that
    avx2_fma fuses multiply-add, at every B (`linear` hands 17-64 rows to `gemm_f32` on avx512_vnni
    instead). Raises ValueError on wrong dtypes/shapes/places."""
    return _run("plk_gemv", x, w, bias, _resolve(isa))[0]


def linear(x: paddle.Tensor, w: paddle.Tensor, bias: paddle.Tensor | None = None,
           isa: str = "generic") -> paddle.Tensor:
    """x [B, K] @ w [N, K]^T (+ bias [N]) -> [B, N]: `gemv` for B <= GEMV_MAX_BATCH, `gemm_f32` up to
    fp32_gemv_max_batch(isa) rows on avx512_vnni (the decode stack picks the same per row count), else
    paddle.matmul(x, w, transpose_y=True) on the same weight (no second copy)."""
    if x.shape[0] <= GEMV_MAX_BATCH:
        return gemv(x, w, bias, isa)
    if x.shape[0] <= fp32_gemv_max_batch(isa):
        return gemm_f32(x, w, bias, isa)
    y = paddle.matmul(x, w, transpose_y=True)
    return y if bias is None else y + bias


def gemm_f32(x: paddle.Tensor, w: paddle.Tensor, bias: paddle.Tensor | None = None,
             isa: str = "avx512_vnni") -> paddle.Tensor:
    """y = x @ w^T (+ bias) by the AVX-512 fp32 GEMM (csrc/gemm_f32.cc; isa "avx512_vnni" only, else
    ValueError): w [N, K] repacked per call in panels of 32 rows, each output one fused multiply-add
    chain over k ascending, then + bias. x [B, K], w [N, K], bias [N] or None, fp32. Returns [B, N]."""
    return _run("plk_gemm_f32", x, w, bias, _resolve(isa))[0]


def gemv_int8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
              isa: str = "generic") -> paddle.Tensor:
    """Weight-only int8: y[b, n] = (sum_k x[b, k] * q[n, k]) * scale[n] (+ bias[n]).

    x: [B, K] fp32; q: [N, K] int8 (from quantize_int8); scale: [N] fp32; bias: [N] fp32 or None.
    Returns [B, N] fp32. The sum uses the fixed order of `gemv` (the unit tests reproduce it
    exactly in numpy). Raises ValueError on wrong dtypes/shapes/places."""
    return _run("plk_gemv_int8", x, q, scale, bias, _resolve(isa))[0]


def linear_int8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
                isa: str = "generic") -> paddle.Tensor:
    """`gemv_int8` for B <= GEMV_INT8_MAX_BATCH; above, x @ dequantize_int8(q, scale)^T with
    paddle.matmul (a temporary fp32 weight for the duration of the call)."""
    if x.shape[0] <= GEMV_INT8_MAX_BATCH:
        return gemv_int8(x, q, scale, bias, isa)
    y = paddle.matmul(x, dequantize_int8(q, scale), transpose_y=True)
    return y if bias is None else y + bias


def gemv_w8a8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
              isa: str = "generic", group: int = 0) -> paddle.Tensor:
    """int8 weights x dynamically quantized int8 activations (llama.cpp's Q8_0 x Q8_0 scheme,
    ggml_vec_dot_q8_0_q8_0, with a per-output-channel weight scale):

        xs[b, g] = max |x[b, group g]| / 127,  xq = clamp(round-half-even(x / xs), -127, 127)
        acc[b, n, g] = sum_{k in g} xq[b, k] * q[n, k]            (exact int32)
        y[b, n] = (sum_g xs[b, g] * acc[b, n, g]) * scale[n] (+ bias[n])

    x: [B, K] fp32; q: [N, K] int8 in [-127, 127] and scale: [N] fp32 (from quantize_int8); bias:
    [N] fp32 or None; group: input channels per activation scale, 0 (or >= K) = one per row, else a
    multiple of 32 (at most 65536). Returns [B, N] fp32. The int32 sums are exact on every isa
    ("avx512_vnni": vpdpbusd; "avx2_fma": vpmaddubsw on |q| and sign(q) * xq; "generic": C++ int
    loops; see csrc/gemv_w8a8_tiles.cc); the result is the formula above summed in group order, bit for
    bit, except that groups of 32 on the vector isas sum their lanes in fp32 (within 2e-6 of it
    relative to the largest output; the unit tests model both). Error against gemv_int8 (fp32 activations):
    at most sum_k |x - xq * xs| |q| scale <= (xs / 2) * sum_k |q[n, k]| * scale[n] per output.
    Raises ValueError on wrong dtypes/shapes/places, a bad group or an isa the CPU lacks."""
    return _run("plk_gemv_w8a8", x, q, scale, bias, int(group), _resolve(isa))[0]


def linear_w8a8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
                isa: str = "generic", group: int = 0, int8_prefill: bool = False) -> paddle.Tensor:
    """`gemv_w8a8` for B <= GEMV_INT8_MAX_BATCH, and for every B with int8_prefill on avx512_vnni (its
    int8 GEMM); otherwise x @ dequantize_int8(q, scale)^T with paddle.matmul on fp32 activations (as
    linear_int8: prefill keeps fp32 activations)."""
    if x.shape[0] <= GEMV_INT8_MAX_BATCH or (int8_prefill and _resolve(isa) == "avx512_vnni"):
        return gemv_w8a8(x, q, scale, bias, isa, group)
    y = paddle.matmul(x, dequantize_int8(q, scale), transpose_y=True)
    return y if bias is None else y + bias


def int8_dot_groups(xq: paddle.Tensor, q: paddle.Tensor, group: int = 0, isa: str = "generic") -> paddle.Tensor:
    """The integer core of gemv_w8a8: acc[b, n, g] = sum_{k in group g} xq[b, k] * q[n, k] as int32
    [B, N, groups]. xq: [B, K] int8, q: [N, K] int8, both in [-127, 127] (ValueError otherwise:
    the AVX2 path's sign trick needs it). Exact on every isa (for tests and the kernel check)."""
    return _run("plk_int8_dot_groups", xq, q, int(group), _resolve(isa))[0]


def gemv_int4(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
              isa: str = "generic") -> paddle.Tensor:
    """Weight-only int4: y[b, n] = sum_k x[b, k] * (q[n, k] * scale[n, k // G]) (+ bias[n]).

    x: [B, K] fp32; q: [N, ceil(K/2)] uint8 and scale: [N, K / G] fp32 from quantize_int4_numpy;
    bias: [N] fp32 or None. Returns [B, N] fp32, bit-identical to `gemv(x, dequantize_int4(q, scale,
    K))` on the same isa (each weight is dequantized to fp32, then summed in gemv's fixed order).
    Raises ValueError on wrong dtypes/shapes/places or a group size the kernel cannot read."""
    return _run("plk_gemv_int4", x, q, scale, bias, _resolve(isa))[0]


def gemv_w4a8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
              isa: str = "avx512_vnni") -> paddle.Tensor:
    """int4 weights x int8 activations (llama.cpp's Q4 x Q8 scheme): x [B, K] fp32 is quantized per
    row and block of 32 input channels (xs = max|x| / 127, round half even, as gemv_w8a8), and
    y[b, n] = sum over 8-channel lanes of float(int32 sum of xq * q) * xs[b, block] * scale[n, group]
    (+ bias[n]). q / scale as gemv_int4 (quantize_int4_numpy). Returns [B, N] fp32. AVX-512 VNNI only
    (isa "avx512_vnni"); K and the group size K / groups must be multiples of 32. Raises ValueError
    otherwise, and on wrong dtypes, shapes or places."""
    return _run("plk_gemv_w4a8", x, q, scale, bias, _resolve(isa))[0]


def linear_w4a8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
                isa: str = "avx512_vnni") -> paddle.Tensor:
    """`gemv_w4a8` for B <= GEMV_INT4_MAX_BATCH; above (prefill), x @ dequantize_int4(q, scale)^T with
    fp32 activations, as linear_int4."""
    if x.shape[0] <= GEMV_INT4_MAX_BATCH:
        return gemv_w4a8(x, q, scale, bias, isa)
    y = paddle.matmul(x, dequantize_int4(q, scale, x.shape[1], isa), transpose_y=True)
    return y if bias is None else y + bias


def dequantize_int4(q: paddle.Tensor, scale: paddle.Tensor, k: int, isa: str = "generic") -> paddle.Tensor:
    """q [N, ceil(k/2)] uint8, scale [N, groups] -> the fp32 [N, k] weight gemv_int4 multiplies by."""
    return _run("plk_dequantize_int4", q, scale, int(k), _resolve(isa))[0]


def linear_int4(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
                isa: str = "generic") -> paddle.Tensor:
    """`gemv_int4` for B <= GEMV_INT4_MAX_BATCH; above, x @ dequantize_int4(q, scale)^T with
    paddle.matmul (a temporary fp32 weight for the duration of the call)."""
    if x.shape[0] <= GEMV_INT4_MAX_BATCH:
        return gemv_int4(x, q, scale, bias, isa)
    y = paddle.matmul(x, dequantize_int4(q, scale, x.shape[1], isa), transpose_y=True)
    return y if bias is None else y + bias


def dequantize_int8(q: paddle.Tensor, scale: paddle.Tensor) -> paddle.Tensor:
    """q [N, K] int8, scale [N] -> q * scale[:, None] as fp32 [N, K] (composed Paddle ops)."""
    return q.astype("float32") * scale.unsqueeze(1)
