"""prefill_attention (query-blocked for long chunks) and the C++ kernel cpu_kernels.paged_prefill_attention
(every dispatch path this host has; fp32, bfloat16 and float16 caches) against a numpy causal GQA
attention in float64, with the context scattered over non-contiguous cache slots (and in runs of
contiguous slots, as paged blocks hold them) and chunks that start mid-sequence.

Bounds: 1e-4 absolute for the composed path (as before); 2e-5 for the kernel (fp32 online softmax;
measured <= 3e-6), against numpy over the cache's own (rounded) values for 16-bit caches."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_llm_ops.cpu_kernels as ck
import paddle_llm_ops.paged_attention as pa
from test_cpu_kernels import ISA_PARAMS

KVH, G, D = 3, 3, 16


def numpy_attention(q, k, v, start_pos, scale):
    """q [n, kvh*g, d]; k, v [kvh, ctx, d] in position order. Query head h uses KV head h // g."""
    n, nh, d = q.shape
    kvh, ctx = k.shape[0], k.shape[1]
    g = nh // kvh
    out = np.zeros((n, nh, d))
    for h in range(nh):
        kh, vh = k[h // g].astype(np.float64), v[h // g].astype(np.float64)
        s = q[:, h].astype(np.float64) @ kh.T * scale
        s[np.arange(ctx)[None, :] > (start_pos + np.arange(n))[:, None]] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p @ vh
    return out.reshape(n, nh * d)


@pytest.mark.parametrize("n,start,block", [(5, 0, 256), (600, 0, 256), (300, 100, 256), (257, 3, 256),
                                           (50, 20, 7), (1, 40, 7)])
def test_prefill_attention_matches_reference(n, start, block, monkeypatch):
    monkeypatch.setattr(pa, "PREFILL_QUERY_BLOCK", block)
    rng = np.random.default_rng(n + start)
    ctx = start + n
    slots_total = ctx + 37
    k_cache = rng.standard_normal((KVH, slots_total, D)).astype(np.float32)
    v_cache = rng.standard_normal((KVH, slots_total, D)).astype(np.float32)
    slots = rng.permutation(slots_total)[:ctx]  # paged: positions live in scattered slots
    q = rng.standard_normal((n, KVH * G, D)).astype(np.float32)
    scale = D ** -0.5
    got = pa.prefill_attention(paddle.to_tensor(q), paddle.to_tensor(k_cache), paddle.to_tensor(v_cache),
                               paddle.to_tensor(slots.astype(np.int64)), start, scale).numpy()
    ref = numpy_attention(q, k_cache[:, slots], v_cache[:, slots], start, scale)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() < 1e-4


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("n,start,nh,kvh,d,runs", [
    (1, 0, 9, 3, 64, True), (5, 0, 9, 3, 64, False), (16, 0, 4, 4, 16, True), (17, 3, 4, 4, 16, False),
    (40, 100, 9, 3, 64, True), (300, 0, 8, 2, 64, True), (33, 70, 8, 2, 12, True), (70, 130, 6, 1, 32, False)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_cpu_prefill_kernel_matches_reference(isa, n, start, nh, kvh, d, runs, dtype):
    """runs: positions in blocks of 16 contiguous slots at shuffled block ids (a paged cache), else
    every position at its own random slot (runs of one); d = 12 takes the generic path on every isa."""
    paddle.set_device("cpu")
    rng = np.random.default_rng(n * 7 + start)
    ctx = start + n
    if runs:
        bs, blocks = 16, -(-ctx // 16) + 4
        ids = rng.permutation(blocks)
        slots = np.array([ids[p // bs] * bs + p % bs for p in range(ctx)], np.int64)
        total = blocks * bs
    else:
        total = ctx + 29
        slots = rng.permutation(total)[:ctx].astype(np.int64)
    kc = paddle.to_tensor(rng.standard_normal((kvh, total, d)).astype(np.float32)).astype(dtype)
    vc = paddle.to_tensor(rng.standard_normal((kvh, total, d)).astype(np.float32)).astype(dtype)
    q = (rng.standard_normal((n, nh, d)) * 2).astype(np.float32)
    got = ck.paged_prefill_attention(paddle.to_tensor(q), kc, vc, paddle.to_tensor(slots), start, d ** -0.5,
                                     isa).numpy()
    k32, v32 = kc.astype("float32").numpy(), vc.astype("float32").numpy()
    ref = numpy_attention(q, k32[:, slots], v32[:, slots], start, d ** -0.5)
    assert got.shape == (n, nh * d)
    assert np.abs(got - ref).max() < 2e-5


def test_cpu_prefill_kernel_refuses_bad_arguments_by_name():
    paddle.set_device("cpu")
    q = paddle.zeros([4, 6, 16], "float32")
    kc = paddle.zeros([2, 32, 16], "float32")
    slots = paddle.to_tensor(np.arange(6, dtype=np.int64))
    with pytest.raises(ValueError, match="context_slots must be"):
        ck.paged_prefill_attention(q, kc, kc, slots, 0, 0.25)  # start 0 + n 4 != 6
    with pytest.raises(ValueError, match="outside the cache"):
        ck.paged_prefill_attention(q, kc, kc, paddle.to_tensor(np.array([0, 1, 40, 3, 4, 5], np.int64)), 2, 0.25)
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        ck.paged_prefill_attention(paddle.zeros([4, 5, 16], "float32"), kc, kc, slots, 2, 0.25)
    with pytest.raises(ValueError, match="one dtype"):
        ck.paged_prefill_attention(q, kc, kc.astype("float16"), slots, 2, 0.25)
