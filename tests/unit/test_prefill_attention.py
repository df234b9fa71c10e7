"""prefill_attention (query-blocked for long chunks) against a numpy causal GQA attention, with the
context scattered over non-contiguous cache slots and chunks that start mid-sequence."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_llm_ops.paged_attention as pa

KVH, G, D = 3, 3, 16


def numpy_attention(q, k, v, start_pos, scale):
    """q [n, kvh*g, d]; k, v [kvh, ctx, d] in position order. Query head h uses KV head h // g."""
    n = q.shape[0]
    ctx = k.shape[1]
    out = np.zeros((n, KVH * G, D))
    for h in range(KVH * G):
        kh, vh = k[h // G].astype(np.float64), v[h // G].astype(np.float64)
        s = q[:, h].astype(np.float64) @ kh.T * scale
        s[np.arange(ctx)[None, :] > (start_pos + np.arange(n))[:, None]] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p @ vh
    return out.reshape(n, KVH * G * D)


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
