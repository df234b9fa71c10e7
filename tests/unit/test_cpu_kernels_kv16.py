"""The C++ CPU kernels over a 16-bit KV cache (bfloat16, float16): the write rounds each value to
nearest even exactly as an independent cast does (numpy's float16, Paddle's bfloat16 cast), edge
values included; decode attention over a 16-bit cache returns bit for bit what it returns over an
fp32 cache holding the same rounded values (reads widen exactly, arithmetic stays fp32), on every
ISA this host runs. The decode stack's equality with the op-by-op path over 16-bit caches is in
test_cpu_decode_stack.py."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_llm_ops.cpu_kernels as ck
from paddle_llm_ops.rotary import RotaryTable
from test_cpu_kernels import ISA_PARAMS, _kernels, _numpy_decode, _paged_case, _rotary_case, t  # noqa: F401 (autouse)

KV16 = ["bfloat16", "float16"]


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x fp32 rounded to dtype by an independent cast, widened back to fp32."""
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    return paddle.to_tensor(x).astype("bfloat16").astype("float32").numpy()


def as16(x: np.ndarray, dtype: str) -> paddle.Tensor:
    return paddle.to_tensor(x).astype(dtype) if dtype == "bfloat16" else paddle.to_tensor(x.astype(np.float16))


def widened(c: paddle.Tensor) -> np.ndarray:
    return c.astype("float32").numpy()


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as floats, NaN where NaN (any NaN payload)."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan], b[~nan]))


def edge_values() -> np.ndarray:
    """Values where rounding goes wrong first: ties in both formats, the fp16 overflow boundary,
    subnormals and their halfway points, signed zeros, inf and NaN."""
    f16_tiny = np.float32(2.0 ** -24)
    ties_f16 = np.float32(1.0) + np.float32(2.0 ** -11) * np.array([1, 3, 5], np.float32)  # halfway between halves
    ties_bf16 = (np.array([0x3f808000, 0x3f818000, 0x40208000], np.uint32)).view(np.float32)  # halfway bf16
    vals = [0.0, -0.0, 1.0, -2.5, 65504.0, 65519.0, 65520.0, 70000.0, -1e6, 1e-8, f16_tiny, f16_tiny / 2,
            f16_tiny * 1.5, f16_tiny * 2.5, 2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -11), 3.0e38, np.inf, -np.inf,
            np.nan, 1e-40, -1e-40]
    return np.concatenate([np.asarray(vals, np.float32), ties_f16, -ties_f16, ties_bf16, -ties_bf16])


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", KV16)
def test_rotary_kv_write_rounds_like_an_independent_cast(isa, dtype):
    rng = np.random.default_rng(3)
    nh, kvh, d = 4, 2, 64
    table = RotaryTable(d, 4096, 10000.0)
    qkv, positions, slots, k_cache, v_cache = _rotary_case(rng, 7, nh, kvh, d)
    edges = edge_values()
    for i in range(qkv.shape[0]):  # v's values of every token: the edge values, then random ones
        qkv[i, (nh + kvh) * d:(nh + kvh) * d + len(edges)] = edges
    k32, v32 = t(k_cache), t(v_cache)
    q_ref = ck.rotary_kv_write(t(qkv), t(positions), table.cos, table.sin, k32, v32, t(slots), nh, kvh, isa=isa)
    k16, v16 = as16(k_cache, dtype), as16(v_cache, dtype)
    before_k = widened(k16)
    q = ck.rotary_kv_write(t(qkv), t(positions), table.cos, table.sin, k16, v16, t(slots), nh, kvh, isa=isa)
    assert k16.dtype == v16.dtype == getattr(paddle, dtype)
    assert np.array_equal(q.numpy(), q_ref.numpy())  # q stays fp32
    got_k, got_v = widened(k16), widened(v16)
    assert bits_equal(got_k[:, slots], rounded(k32.numpy()[:, slots], dtype))
    assert bits_equal(got_v[:, slots], rounded(v32.numpy()[:, slots], dtype))
    others = np.setdiff1d(np.arange(k_cache.shape[1]), slots)
    assert np.array_equal(got_k[:, others], before_k[:, others])  # no other slot touched
    if dtype == "float16":  # the edge values on their own: overflow to inf, subnormals kept
        row = got_v[0, slots[0], :len(edges)]
        assert row[7] == np.inf and row[6] == np.inf and row[5] == np.float32(65504.0)
        assert row[10] == np.float32(2.0 ** -24) and row[11] == 0.0


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", KV16)
@pytest.mark.parametrize("ctx,nh,kvh,d,bs", [
    ([1], 9, 3, 64, 64),
    ([1500], 9, 3, 64, 64),                       # one long context, split over threads
    ([1, 63, 64, 65, 700, 130, 5], 9, 3, 64, 16),  # ragged, sub-blocks cut by block edges
    ([40, 80], 4, 4, 128, 32),
    ([23, 7], 6, 3, 12, 8),                       # d 12: the generic kernel and scalar widening tails
])
def test_decode_attention_over_16bit_cache_equals_fp32_over_rounded_values(isa, dtype, ctx, nh, kvh, d, bs):
    rng = np.random.default_rng(sum(ctx) + d)
    k_cache, v_cache, tables, slots = _paged_case(rng, ctx, kvh, d, bs)
    k_cache, v_cache = rounded(k_cache * 3, dtype), rounded(v_cache, dtype)
    q = rng.standard_normal((len(ctx), nh, d)).astype(np.float32)
    lens = t(np.asarray(ctx, np.int32))
    ref = ck.paged_decode_attention(t(q), t(k_cache), t(v_cache), t(tables), lens, d ** -0.5, bs, isa=isa).numpy()
    got = ck.paged_decode_attention(t(q), as16(k_cache, dtype), as16(v_cache, dtype), t(tables), lens, d ** -0.5,
                                    bs, isa=isa).numpy()
    assert np.array_equal(got, ref)
    assert np.abs(got - _numpy_decode(q, k_cache, v_cache, slots, d ** -0.5)).max() <= 1e-5


def test_caches_of_two_dtypes_or_an_unsupported_dtype_are_refused_by_name():
    rng = np.random.default_rng(1)
    k_cache, v_cache, tables, _ = _paged_case(rng, [5], 1, 16, 8)
    q, lens = t(rng.standard_normal((1, 2, 16)).astype(np.float32)), t(np.asarray([5], np.int32))
    with pytest.raises(ValueError, match="one dtype"):
        ck.paged_decode_attention(q, as16(k_cache, "bfloat16"), as16(v_cache, "float16"), t(tables), lens, 0.25, 8)
    with pytest.raises(ValueError, match="k_cache has dtype.*expected float32, bfloat16 or float16"):
        ck.paged_decode_attention(q, t(k_cache.astype(np.float64)), t(v_cache.astype(np.float64)), t(tables), lens,
                                  0.25, 8)
