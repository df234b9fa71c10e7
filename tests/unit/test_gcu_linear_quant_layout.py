"""GcuQuantLinear's quantizer (paddle_llm_ops.gcu.linear_quant) on the CPU, no plug-in: the layout
linear_quant_gcu reads, built here by hand from the description of paddle-custom-gcu's
weight_quantize + FastDeploy's rearrange_for_w4a16 (module docstring), element by element."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_llm_ops.gcu.linear_quant import dequantize_linear_quant, quantize_for_linear_quant


def test_int8_is_the_transposed_matrix_rounded_half_away_from_zero():
    w = np.zeros((4, 2), np.float32)              # [K, N]
    w[:, 0] = [127.0, 0.5, -0.5, 1.5]             # scale 1: ties go away from zero
    w[:, 1] = [-2.0, 1.0, 0.0, 0.25]              # scale 2 / 127
    rhs, scale = quantize_for_linear_quant(w, 8, -1)
    assert rhs.dtype == np.int8 and rhs.shape == (2, 4) and scale.shape == (2,)
    assert list(rhs[0]) == [127, 1, -1, 2]
    assert scale[1] == np.float32(2.0) / np.float32(127) and rhs[1, 0] == -127


def test_int4_nibbles_are_offset_binary_packed_in_chunks_of_128():
    k, n = 200, 3                                  # K padded to 256: two chunks of 128
    rng = np.random.default_rng(1)
    q = rng.integers(-7, 8, (k, n)).astype(np.float32)
    q[0] = 7                                       # every column's max |q| = 7: scale 1
    rhs, scale = quantize_for_linear_quant(q, 4, -1)
    assert rhs.dtype == np.uint8 and rhs.shape == (n, 128) and np.all(scale == 1)
    for col in range(n):
        for c in range(2):
            for j in (0, 5, 63):
                lo, hi = 128 * c + j, 128 * c + 64 + j
                want_lo = int(q[lo, col]) + 8 if lo < k else 0   # padding is the zero nibble
                want_hi = int(q[hi, col]) + 8 if hi < k else 0
                assert rhs[col, 64 * c + j] == want_lo | (want_hi << 4), (col, c, j)


@pytest.mark.parametrize("bits,group,k", [(8, -1, 96), (8, 64, 128), (4, -1, 200), (4, 64, 256), (4, 128, 384)])
def test_round_trip_within_half_a_step(bits, group, k):
    rng = np.random.default_rng(bits + k)
    w = (rng.standard_normal((k, 24)) * rng.uniform(0.1, 3.0, (1, 24))).astype(np.float32)
    rhs, scale = quantize_for_linear_quant(w, bits, group)
    assert scale.shape == ((24,) if group == -1 else (k // group, 24))
    step = np.broadcast_to(scale, w.shape) if group == -1 else np.repeat(scale, group, axis=0)
    deq = dequantize_linear_quant(rhs, scale, bits, k)
    assert deq.shape == w.shape
    assert np.all(np.abs(deq - w) <= step / 2 * (1 + 1e-6))


def test_scale_rounded_to_the_model_dtype_before_quantizing():
    w = np.random.default_rng(2).standard_normal((128, 8)).astype(np.float32)
    _, s32 = quantize_for_linear_quant(w, 4, 64, "float32")
    rhs, s16 = quantize_for_linear_quant(w, 4, 64, "bfloat16")
    assert not np.array_equal(s32, s16) and np.allclose(s32, s16, rtol=1e-2)
    step = np.repeat(s16, 64, axis=0)  # the stored scale is the one q was divided by
    assert np.all(np.abs(dequantize_linear_quant(rhs, s16, 4, 128) - w) <= step / 2 * (1 + 1e-6))


def test_bad_bits_or_group_refused():
    with pytest.raises(ValueError, match="8 or 4"):
        quantize_for_linear_quant(np.ones((64, 2), np.float32), 2, -1)
    with pytest.raises(ValueError, match="quantization_group_size 64 does not divide"):
        quantize_for_linear_quant(np.ones((96, 2), np.float32), 4, 64)


@pytest.mark.parametrize("bits,k,n,pad", [(4, 256, 256, 16), (4, 256, 48, 0), (8, 256, 256, 0)])
def test_square_int4_weight_gets_extra_output_channels(bits, k, n, pad):
    """linear_quant_gcu sizes its output as rhs.shape[-1] when lhs's K == rhs.shape[0]: for a square
    int4 weight (rhs [N, Kp / 2], N == K) that is Kp / 2. GcuQuantLinear appends zero output
    channels so that rhs.shape[0] != K, and keeps the real width to slice the output back."""
    from paddle_llm_ops.gcu.linear_quant import GcuQuantLinear

    rng = np.random.default_rng(3)
    w = rng.standard_normal((k, n)).astype(np.float32)
    lin = GcuQuantLinear(w, rng.standard_normal(n).astype(np.float32), "float32", bits, -1)
    rows = lin.qweight.shape[0]
    assert (lin.padded_out, lin.out_features, rows) == (pad, n, n + pad)
    assert rows != k or bits == 8  # the shape rule then picks rhs.shape[0]
    if pad:
        deq = dequantize_linear_quant(lin.qweight.numpy(), lin.scale.numpy(), bits, k)
        assert np.all(deq[:, n:] == 0) and np.all(lin.bias.numpy()[n:] == 0)
        assert np.abs(deq[:, :n] - w).max() <= lin.scale.numpy()[:n].max() / 2 + 1e-6
