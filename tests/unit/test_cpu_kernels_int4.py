"""The C++ int4 weight-only GEMV (cpu_kernels.gemv_int4 / linear_int4 / dequantize_int4 and
quantize_int4_numpy) on both dispatch paths, against numpy (cpu_kernels_reference.py).

Bounds: the quantizer's bytes equal an independent packing of round-half-even(w / (max|group| / 7));
every weight within scale / 2 of its dequantized value; the GEMV bit-identical to the numpy model of
its arithmetic and to the fp32 GEMV over the dequantized weight (same isa), and, against the fp32
weights, within sum_k |x_k| * scale_{n, g(k)} / 2 (+ fp32 slack).
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_llm_ops.cpu_kernels as ck
from cpu_kernels_reference import dequantize_int4_reference, gemv_int4_reference, gemv_w4a8_reference
from test_cpu_kernels import HOST_VNNI, ISA_PARAMS, rel_err, t


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    paddle.set_device("cpu")
    ck.load()  # KernelsNotBuiltError (run scripts/setup.sh) fails every test here, never skips
    yield
    ck.set_num_threads(0)


def _weights(rng, n, k):
    return (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)


# ------------------------------------------------------------------------------------ quantizer
def test_quantize_int4_packing_rounding_and_zero_groups():
    w = np.zeros((3, 16), np.float32)
    w[0, :8] = [7.0, 0.5, 1.5, 2.5, -0.5, -2.5, -7.0, 3.4]   # scale 1: ties round half to even
    w[0, 8:] = np.arange(8) * 0.5                             # second group: scale 0.5
    w[2] = -np.arange(16, dtype=np.float32)                   # row 1 stays zero: scale 0, q 0
    q, s = ck.quantize_int4_numpy(w, 8)
    assert q.dtype == np.uint8 and q.shape == (3, 8) and s.shape == (3, 2)
    assert s[0, 0] == 1.0 and s[0, 1] == np.float32(3.5) / 7 and not s[1].any()
    vals = dequantize_int4_reference(q, np.ones_like(s), 16)
    assert list(vals[0, :8]) == [7, 0, 2, 2, 0, -2, -7, 3]
    assert list(vals[0, 8:]) == list(range(8))
    assert list(q[0, :4]) == [0x07, 0x22, 0xE0, 0x39]  # (7, 0) (2, 2) (0, -2) (-7, 3): low nibble = even k
    assert not q[1].any()
    scales = np.repeat([np.float32(7) / 7, np.float32(15) / 7], 8)  # max |w| of each group of 8, / 7
    expected = np.clip(np.rint(w[2] / scales), -7, 7)
    assert np.array_equal(dequantize_int4_reference(q, np.ones_like(s), 16)[2], expected)


@pytest.mark.parametrize("n,k,group", [(37, 75, -1), (8, 128, 64), (5, 576, 8), (4, 64, 64)])
def test_quantize_int4_error_within_half_a_step(n, k, group):
    rng = np.random.default_rng(n + k)
    w = _weights(rng, n, k)
    q, s = ck.quantize_int4_numpy(w, group)
    g = k if group == -1 else group
    assert s.shape == (n, k // g) and q.shape == (n, (k + 1) // 2)
    err = np.abs(dequantize_int4_reference(q, s, k) - w)
    assert np.all(err <= np.repeat(s, g, axis=1) / 2 * (1 + 1e-6))


@pytest.mark.parametrize("group", [0, -2, 12, 40, 100])
def test_quantize_int4_rejects_group_sizes_the_kernel_cannot_read(group):
    with pytest.raises(ValueError, match="group_size"):
        ck.quantize_int4_numpy(np.ones((2, 96), np.float32), group)


# ------------------------------------------------------------------------------------ GEMV
SHAPES = [(1, 960, 576, -1), (1, 576, 1536, 64), (1, 13, 67, -1), (3, 40, 128, 8), (5, 37, 576, 64),
          (8, 300, 1536, 64), (32, 64, 576, -1), (2, 9, 5, -1), (1, 7, 64, 64)]


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("b,n,k,group", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_int4_exact_and_within_quantization_bound(isa, b, n, k, group, with_bias):
    rng = np.random.default_rng(b * 7 + n + k + group)
    x = rng.standard_normal((b, k)).astype(np.float32)
    w = _weights(rng, n, k)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    q, s = ck.quantize_int4_numpy(w, group)
    tb = None if bias is None else t(bias)
    got = ck.gemv_int4(t(x), t(q), t(s), tb, isa=isa).numpy()
    model = gemv_int4_reference(x, q, s, bias, fused=(isa != "generic"))
    assert np.array_equal(got, model), f"max diff {np.abs(got - model).max()}"
    deq = ck.dequantize_int4(t(q), t(s), k, isa=isa)
    assert np.array_equal(deq.numpy(), dequantize_int4_reference(q, s, k))
    assert np.array_equal(got, ck.gemv(t(x), deq, tb, isa=isa).numpy())
    exact = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if bias is None else bias)
    g = k if group == -1 else group
    bound = np.abs(x) @ np.repeat(s, g, axis=1).T / 2
    slack = 1e-5 * (np.abs(x) @ np.abs(w).T + (0 if bias is None else np.abs(bias)))
    assert np.all(np.abs(got - exact) <= bound + slack)


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("b", [1, 4])
def test_gemv_int4_threads_do_not_change_results(isa, b):
    rng = np.random.default_rng(11)
    x = t(rng.standard_normal((b, 576)).astype(np.float32))
    q, s = ck.quantize_int4_numpy(_weights(rng, 6144, 576), 64)  # 1.7 MB of int4: several threads
    ck.set_num_threads(1)
    one = ck.gemv_int4(x, t(q), t(s), isa=isa).numpy()
    ck.set_num_threads(2)
    two = ck.gemv_int4(x, t(q), t(s), isa=isa).numpy()
    ck.set_num_threads(0)
    assert np.array_equal(one, two)


@pytest.mark.parametrize("b", [1, ck.GEMV_INT4_MAX_BATCH, ck.GEMV_INT4_MAX_BATCH + 1, 300])
def test_linear_int4_any_batch(b):
    rng = np.random.default_rng(b)
    x = t(rng.standard_normal((b, 128)).astype(np.float32))
    q, s = ck.quantize_int4_numpy(_weights(rng, 40, 128), 64)
    bias = t(rng.standard_normal(40).astype(np.float32))
    ref = paddle.matmul(x, t(dequantize_int4_reference(q, s, 128)), transpose_y=True) + bias
    assert rel_err(ck.linear_int4(x, t(q), t(s), bias).numpy(), ref.numpy()) <= 1e-5


def test_gemv_int4_rejects_bad_inputs():
    x = t(np.ones((2, 32), np.float32))
    q, s = ck.quantize_int4_numpy(np.ones((3, 32), np.float32), 8)
    with pytest.raises(ValueError, match="ceil"):
        ck.gemv_int4(t(np.ones((2, 40), np.float32)), t(q), t(s))
    with pytest.raises(ValueError, match="dtype"):
        ck.gemv_int4(x, t(q.view(np.int8)), t(s))
    with pytest.raises(ValueError, match="multiple of 8"):
        ck.gemv_int4(x, t(q), t(np.ones((3, 8), np.float32)))  # groups of 4 weights
    with pytest.raises(ValueError, match="bias"):
        ck.gemv_int4(x, t(q), t(s), t(np.ones(4, np.float32)))


# ------------------------------------------------------------------------------ int4 x int8
needs_vnni = pytest.mark.skipif(not HOST_VNNI, reason="gemv_w4a8 runs on AVX-512 VNNI only (refusal tested below)")


@needs_vnni
@pytest.mark.parametrize("b, n, k, group", [(1, 960, 576, 64), (3, 37, 1536, 64), (5, 21, 576, 576),
                                            (8, 64, 96, 32), (2, 24, 160, 32), (64, 9, 128, 128),
                                            (17, 33, 96, 32), (23, 70, 576, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_w4a8_against_the_exact_integer_reference(b, n, k, group, with_bias):
    """Odd output counts (tiles of 4 and single rows), K not a multiple of 128 (a half vector step),
    per-channel and per-32 groups, batches across the 3-row tiles, up to the batch limit; from 16
    rows the int8 GEMM's panels (int4 unpacked per call; tails of its 6-row tiles and 32-channel
    panels)."""
    rng = np.random.default_rng(b * 1000 + k)
    x = rng.standard_normal((b, k)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block: scale 0, contributes nothing
    q, s = ck.quantize_int4_numpy(_weights(rng, n, k), group)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    got = ck.gemv_w4a8(t(x), t(q), t(s), None if bias is None else t(bias)).numpy()
    ref = gemv_w4a8_reference(x, q, s, k, bias)
    assert got.shape == (b, n) and np.isfinite(got).all()
    assert rel_err(got, ref) <= 2e-6


@needs_vnni
def test_gemv_w4a8_close_to_the_weight_only_path_and_thread_invariant():
    rng = np.random.default_rng(3)
    x = t(rng.standard_normal((2, 576)).astype(np.float32))
    q, s = ck.quantize_int4_numpy(_weights(rng, 3072, 576), 64)
    weight_only = ck.gemv_int4(x, t(q), t(s), isa="avx2_fma").numpy()
    ck.set_num_threads(1)
    one = ck.gemv_w4a8(x, t(q), t(s)).numpy()
    ck.set_num_threads(2)
    two = ck.gemv_w4a8(x, t(q), t(s)).numpy()
    ck.set_num_threads(0)
    assert np.array_equal(one, two)
    # int8 activations per block of 32: a relative error of about 1/254 per activation, averaged down
    assert rel_err(one, weight_only) <= 2e-2


@needs_vnni
@pytest.mark.parametrize("b", [1, ck.GEMV_INT4_MAX_BATCH, ck.GEMV_INT4_MAX_BATCH + 1])
def test_linear_w4a8_any_batch(b):
    rng = np.random.default_rng(b)
    x = t(rng.standard_normal((b, 64)).astype(np.float32))
    q, s = ck.quantize_int4_numpy(_weights(rng, 40, 64), 32)
    got = ck.linear_w4a8(x, t(q), t(s)).numpy()
    if b <= ck.GEMV_INT4_MAX_BATCH:
        assert rel_err(got, gemv_w4a8_reference(x.numpy(), q, s, 64)) <= 2e-6
    else:  # prefill: fp32 activations times the dequantized weight
        ref = paddle.matmul(x, ck.dequantize_int4(t(q), t(s), 64), transpose_y=True).numpy()
        assert rel_err(got, ref) <= 1e-5


def test_gemv_w4a8_refuses_what_it_cannot_run():
    q, s = ck.quantize_int4_numpy(np.ones((3, 64), np.float32), 32)
    with pytest.raises(ValueError, match="avx512_vnni only"):
        ck.gemv_w4a8(t(np.ones((1, 64), np.float32)), t(q), t(s), isa="avx2_fma")
    if HOST_VNNI:
        q16, s16 = ck.quantize_int4_numpy(np.ones((3, 64), np.float32), 16)
        with pytest.raises(ValueError, match="multiples of 32"):
            ck.gemv_w4a8(t(np.ones((1, 64), np.float32)), t(q16), t(s16))
        q40, s40 = ck.quantize_int4_numpy(np.ones((3, 40), np.float32), 8)
        with pytest.raises(ValueError, match="multiples of 32"):
            ck.gemv_w4a8(t(np.ones((1, 40), np.float32)), t(q40), t(s40))


def test_int4_linear_picks_int8_activations_only_where_they_run():
    from paddle_llm_ops.linear import Int4Linear

    w = np.random.default_rng(0).standard_normal((64, 40)).astype(np.float32)  # [in, out]
    assert Int4Linear(w, None, "avx2_fma", 32).kind == "int4"
    assert Int4Linear(w, None, "avx512_vnni", 32).kind == "w4a8"
    assert Int4Linear(w, None, "avx512_vnni", 16).kind == "int4"  # groups of 16: weight-only
    assert Int4Linear(w, None, "avx512_vnni", 32, activations="fp32").kind == "int4"
    with pytest.raises(ValueError, match="multiples of 32"):
        Int4Linear(w, None, "avx512_vnni", 16, activations="int8")
    with pytest.raises(ValueError, match="activations"):
        Int4Linear(w, None, "avx512_vnni", 32, activations="int4")
