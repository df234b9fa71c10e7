"""The C++ int8 x int8 GEMV of wint8 (cpu_kernels.gemv_w8a8 / linear_w8a8, quantize_activations_int8,
int8_dot_groups) on every dispatch path this host has, against numpy written here (int64 sums).

Bounds: activation quantization bit-identical to an independent numpy quantizer; the integer group
sums identical on every isa and to numpy's int64 sums (integer sums are exact: no tolerance); the
GEMV bit-identical to numpy's model of the exact path (per row, groups of 64: one scalar fp32
multiply-add per group in group order) and, for groups of 32 on the vector isas (lanes summed in
fp32), within 2e-6 of it relative to the largest output; against fp32 activations within the
activation rounding bound sum_k |q scale| xs / 2 (+ fp32 slack). The AVX-512 VNNI GEMM (from
W8A8_GEMM_MIN_ROWS rows; forced to every row count here) bit-identical to the exact path's model,
across its tails (rows of a 6-row micro-tile and of a 192-row block, a 32-channel panel, a 4-channel
unit, a partial group) and thread counts.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_llm_ops.cpu_kernels as ck
from paddle_llm_ops.linear import Int8Linear
from test_cpu_kernels import HOST_AVX2_FMA, HOST_VNNI, ISA_PARAMS, t

ALL_ISAS = [i for i, ok in (("generic", True), ("avx2_fma", HOST_AVX2_FMA), ("avx512_vnni", HOST_VNNI)) if ok]


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    paddle.set_device("cpu")
    ck.load()
    yield
    ck.set_num_threads(0)


def _act_quant(x: np.ndarray, g: int):
    """Independent numpy: per row and group of g, s = max|x| / 127 (fp32), q = rint(x / s) clipped."""
    b, k = x.shape
    groups = -(-k // g)
    xq, xs = np.zeros((b, k), np.int8), np.zeros((b, groups), np.float32)
    for r in range(b):
        for j in range(groups):
            seg = x[r, j * g:(j + 1) * g]
            s = np.float32(np.max(np.abs(seg))) / np.float32(127)
            xs[r, j] = s
            if s > 0:
                xq[r, j * g:(j + 1) * g] = np.clip(np.rint(seg / s), -127, 127).astype(np.int8)
    return xq, xs


def _group_sums(xq, q, g):
    k = xq.shape[1]
    return np.stack([xq[:, j * g:(j + 1) * g].astype(np.int64) @ q[:, j * g:(j + 1) * g].astype(np.int64).T
                     for j in range(-(-k // g))], axis=-1)


def _model(x, q, s, bias, g):
    """The exact path's arithmetic: v = 0; v = v + xs_g * float32(acc_g) per group; y = v * s (+ bias)."""
    xq, xs = _act_quant(x, g)
    acc = _group_sums(xq, q, g)
    v = np.zeros(acc.shape[:2], np.float32)
    for j in range(acc.shape[2]):
        v = (v + (xs[:, j:j + 1] * acc[:, :, j].astype(np.float32)).astype(np.float32)).astype(np.float32)
    y = (v * s[None, :]).astype(np.float32)
    return y if bias is None else (y + bias).astype(np.float32)


def _data(seed, b, n, k):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.05, 2.0, (n, 1))).astype(np.float32)
    x = (rng.standard_normal((b, k)) * rng.uniform(0.1, 5.0, (b, 1))).astype(np.float32)
    x[0, : min(k, 40)] = 0  # an all-zero group (scale 0)
    x[-1, 3 % k] = 40.0     # an outlier
    q, s = ck.quantize_int8_numpy(w)
    return rng, w, x, q, s, rng.standard_normal(n).astype(np.float32)


SHAPES = [(1, 960, 576), (3, 13, 67), (8, 300, 576), (32, 64, 1536), (5, 7, 5), (2, 40, 200)]


@pytest.mark.parametrize("b,n,k", SHAPES)
@pytest.mark.parametrize("group", [0, 32, 64])
def test_activation_quantization_bit_identical_to_numpy(b, n, k, group):
    _, _, x, _, _, _ = _data(1, b, n, k)
    g = k if group == 0 or group >= k else group
    xq, xs = ck.quantize_activations_int8(t(x), group)
    ref_q, ref_s = _act_quant(x, g)
    assert np.array_equal(xq.numpy(), ref_q) and np.array_equal(xs.numpy(), ref_s)
    npq, nps = ck.quantize_activations_numpy(x, group)
    assert np.array_equal(npq, ref_q) and np.array_equal(nps, ref_s)
    assert np.all(np.abs(ref_q.astype(np.float32) * np.repeat(ref_s, g, axis=1)[:, :k] - x)
                  <= np.repeat(ref_s, g, axis=1)[:, :k] / 2 * (1 + 1e-6))


@pytest.mark.parametrize("b,n,k", SHAPES + [(4, 9, 4096)])
@pytest.mark.parametrize("group", [0, 32, 64, 128])
def test_int32_accumulators_identical_on_every_isa_and_to_numpy(b, n, k, group):
    rng = np.random.default_rng(b * n + k)
    # the extremes: +-127 everywhere saturates vpmaddubsw with the naive x + 128 offset
    xq = rng.choice(np.array([-127, 127, -1, 0, 1, 64], np.int8), (b, k))
    q = rng.integers(-127, 128, (n, k)).astype(np.int8)
    q[0] = 127
    xq[0] = -127
    g = k if group == 0 or group >= k else group
    ref = _group_sums(xq, q, g)
    for isa in ALL_ISAS:
        acc = ck.int8_dot_groups(t(xq), t(q), group, isa).numpy()
        assert acc.dtype == np.int32 and np.array_equal(acc.astype(np.int64), ref), isa


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("b,n,k", SHAPES)
@pytest.mark.parametrize("group", [0, 32, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_w8a8_against_numpy_and_the_rounding_bound(isa, b, n, k, group, with_bias):
    _, w, x, q, s, bias = _data(7, b, n, k)
    bias = bias if with_bias else None
    g = k if group == 0 or group >= k else group
    got = ck.gemv_w8a8(t(x), t(q), t(s), None if bias is None else t(bias), isa, group).numpy()
    model = _model(x, q, s, bias, g)
    if g == 32 and g < k and isa != "generic":  # the lane paths: fp32 summation order differs
        assert np.abs(got - model).max() <= 2e-6 * max(1.0, np.abs(model).max())
    else:
        assert np.array_equal(got, model)
    # against fp32 activations times the dequantized weights: activation rounding only
    deq = q.astype(np.float64) * s[:, None]
    ref = x.astype(np.float64) @ deq.T + (0 if bias is None else bias)
    _, xs = _act_quant(x, g)
    bound = (np.repeat(xs, g, axis=1)[:, :k] / 2) @ np.abs(deq).T + 1e-5 * max(1.0, np.abs(ref).max())
    assert np.all(np.abs(got - ref) <= bound)


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_threads_do_not_change_results(isa):
    _, _, x, q, s, bias = _data(3, 8, 4096, 576)
    ys = []
    for threads in (1, 2):
        ck.set_num_threads(threads)
        ys.append(ck.gemv_w8a8(t(x), t(q), t(s), t(bias), isa, 32).numpy())
    ck.set_num_threads(0)
    assert np.array_equal(ys[0], ys[1])


@pytest.mark.skipif(not HOST_VNNI, reason="the int8 GEMM is AVX-512 VNNI code; this CPU lacks it")
@pytest.mark.parametrize("b", [1, 5, 7, 13, 64, 197])
@pytest.mark.parametrize("n,k", [(1, 5), (31, 67), (33, 576), (100, 1000)])
@pytest.mark.parametrize("group", [0, 32, 64])
def test_vnni_gemm_bit_identical_to_the_exact_path(b, n, k, group):
    """Groups that are not a multiple of 4 channels (per-row groups of K = 5 or 67) are declined by
    the GEMM and answered by the exact tiles: the same model holds either way."""
    _, _, x, q, s, bias = _data(11, b, n, k)
    g = k if group == 0 or group >= k else group
    ck.set_w8a8_gemm_min_rows(1)
    try:
        got = ck.gemv_w8a8(t(x), t(q), t(s), t(bias), "avx512_vnni", group).numpy()
        plain = ck.gemv_w8a8(t(x), t(q), t(s), None, "avx512_vnni", group).numpy()
    finally:
        ck.set_w8a8_gemm_min_rows(0)
    assert np.array_equal(got, _model(x, q, s, bias, g))
    assert np.array_equal(plain, _model(x, q, s, None, g))


@pytest.mark.skipif(not HOST_VNNI, reason="the int8 GEMM is AVX-512 VNNI code; this CPU lacks it")
def test_vnni_gemm_default_rows_and_threads():
    """At the default threshold a 16-64-row decode batch takes the GEMM: the exact path's result,
    the same on 1 and 2 threads, and the same as the generic isa's."""
    _, _, x, q, s, bias = _data(5, ck.W8A8_GEMM_MIN_ROWS + 5, 1536, 576)
    ys = []
    for threads in (1, 2):
        ck.set_num_threads(threads)
        ys.append(ck.gemv_w8a8(t(x), t(q), t(s), t(bias), "avx512_vnni", 32).numpy())
    ck.set_num_threads(0)
    assert np.array_equal(ys[0], ys[1])
    assert np.array_equal(ys[0], ck.gemv_w8a8(t(x), t(q), t(s), t(bias), "generic", 32).numpy())


@pytest.mark.skipif(not HOST_VNNI, reason="the int8 GEMM is AVX-512 VNNI code; this CPU lacks it")
def test_linear_w8a8_int8_prefill_takes_the_gemm_at_every_row_count():
    _, _, x, q, s, bias = _data(6, ck.GEMV_INT8_MAX_BATCH + 9, 40, 96)
    got = ck.linear_w8a8(t(x), t(q), t(s), t(bias), "avx512_vnni", 32, int8_prefill=True).numpy()
    assert np.array_equal(got, _model(x, q, s, bias, 32))
    lin = Int8Linear(ck.dequantize_int8(t(q), t(s)).numpy().T, bias, "avx512_vnni", int8_prefill=True)
    assert np.array_equal(lin(t(x)).numpy(), ck.gemv_w8a8(t(x), lin.qweight, lin.scale, lin.bias, "generic", 32).numpy())


@pytest.mark.parametrize("isa", ["avx2_fma", "generic"])
def test_int8_prefill_is_refused_off_the_vnni_path(isa):
    with pytest.raises(ValueError, match="int8_prefill needs int8 activations on avx512_vnni"):
        Int8Linear(np.ones((64, 8), np.float32), None, isa, int8_prefill=True)


def test_linear_w8a8_prefill_uses_fp32_activations():
    _, _, x, q, s, bias = _data(4, ck.GEMV_INT8_MAX_BATCH + 3, 24, 64)
    got = ck.linear_w8a8(t(x), t(q), t(s), t(bias), "generic", 32).numpy()
    ref = x.astype(np.float64) @ (q.astype(np.float64) * s[:, None]).T + bias
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_bad_arguments_are_refused():
    x, q, s = t(np.ones((2, 64), np.float32)), t(np.ones((3, 64), np.int8)), t(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        ck.gemv_w8a8(x, q, s, None, "generic", 48)
    with pytest.raises(ValueError, match="q must be"):
        ck.gemv_w8a8(x, t(np.ones((3, 60), np.int8)), s, None, "generic")
    with pytest.raises(ValueError, match="in \\[-127, 127\\]"):
        ck.int8_dot_groups(t(np.full((1, 64), -128, np.int8)), q, 0, "generic")
    with pytest.raises(ValueError, match="unknown isa"):
        ck.gemv_w8a8(x, q, s, None, "avx9")


def test_int8_linear_picks_activations_by_isa():
    rng = np.random.default_rng(9)
    w, x = rng.standard_normal((64, 40)).astype(np.float32), rng.standard_normal((2, 64)).astype(np.float32)
    q, s = ck.quantize_int8_numpy(w.T)
    assert Int8Linear(w, None, "generic").activations == "fp32"
    for isa in ALL_ISAS[1:]:
        lin = Int8Linear(w, None, isa)
        assert lin.activations == "int8"
        assert np.array_equal(lin(t(x)).numpy(), ck.gemv_w8a8(t(x), t(q), t(s), None, isa, ck.W8A8_GROUP).numpy())
    old = Int8Linear(w, None, ALL_ISAS[-1], activations="fp32")
    assert np.array_equal(old(t(x)).numpy(), ck.gemv_int8(t(x), t(q), t(s), None, ALL_ISAS[-1]).numpy())
    with pytest.raises(ValueError, match="activations"):
        Int8Linear(w, None, "generic", activations="fp16")
