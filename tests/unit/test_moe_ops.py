"""The composed mixture-of-experts expert kernel (paddle_llm_ops.moe) against a per-token numpy
reference: tokens grouped by expert, idle experts skipped, results back in token order, weighted."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_llm_ops.moe import COMPOSED_MOE, FUSED_GCU_MOE, group_by_expert

H, I, E = 16, 8, 6


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _experts(rng):
    gate_up = [rng.standard_normal((2 * I, H)).astype(np.float32) / 4 for _ in range(E)]
    down = [rng.standard_normal((H, I)).astype(np.float32) / 3 for _ in range(E)]
    return gate_up, down


def _reference(x, ids, w, gate_up, down):
    out = np.zeros_like(x, dtype=np.float64)
    for t in range(x.shape[0]):  # the definition, token by token
        for j in range(ids.shape[1]):
            g = gate_up[ids[t, j]] @ x[t]
            h = _silu(g[:I]) * g[I:]
            out[t] += w[t, j] * (down[ids[t, j]] @ h)
    return out


@pytest.mark.parametrize("tokens, k, ids", [
    (1, 2, [[4, 1]]),                                  # a decode step: 4 of 6 experts idle
    (5, 2, [[0, 3], [3, 0], [5, 3], [0, 5], [3, 5]]),  # experts 1, 2, 4 idle
    (4, 3, [[2, 1, 0], [0, 1, 2], [5, 4, 3], [1, 2, 5]]),
    (3, 1, [[2], [2], [2]]),                           # every token to one expert
])
def test_composed_experts_match_the_per_token_definition(tokens, k, ids):
    rng = np.random.default_rng(tokens * 10 + k)
    gate_up, down = _experts(rng)
    x = rng.standard_normal((tokens, H)).astype(np.float32)
    ids = np.asarray(ids, np.int64)
    w = rng.uniform(0.1, 1.0, (tokens, k)).astype(np.float32)
    packed = COMPOSED_MOE.pack(gate_up, down, "float32")
    calls = []
    orig = paddle.matmul

    def counting_matmul(a, b, *args, **kw):
        calls.append(a.shape[0])
        return orig(a, b, *args, **kw)

    paddle.matmul = counting_matmul
    try:
        got = COMPOSED_MOE(paddle.to_tensor(x), paddle.to_tensor(ids), paddle.to_tensor(w), packed).numpy()
    finally:
        paddle.matmul = orig
    np.testing.assert_allclose(got, _reference(x, ids, w, gate_up, down), rtol=1e-5, atol=1e-5)
    counts = np.bincount(ids.ravel(), minlength=E)
    # two matmuls per expert that received tokens, on exactly its rows; none for idle experts
    assert calls == [int(n) for n in counts[counts > 0] for _ in range(2)]


def test_group_by_expert_is_a_stable_permutation():
    ids = np.array([[3, 1], [1, 0], [3, 2]])
    order, counts, inverse = group_by_expert(ids, 5)
    flat = ids.ravel()
    assert flat[order].tolist() == [0, 1, 1, 2, 3, 3]
    assert order.tolist() == [3, 1, 2, 5, 0, 4]  # token order kept within an expert
    assert counts.tolist() == [1, 2, 1, 2, 0]
    assert (order[inverse] == np.arange(6)).all()


def test_packed_layouts():
    rng = np.random.default_rng(0)
    gate_up, down = _experts(rng)
    per_expert = COMPOSED_MOE.pack(gate_up, down, "float32")
    assert (per_expert.num_experts, per_expert.intermediate_size) == (E, I)
    assert per_expert.gate_up[2].shape == [H, 2 * I] and per_expert.down[2].shape == [I, H]
    np.testing.assert_array_equal(per_expert.gate_up[2].numpy(), gate_up[2].T)
    stacked = FUSED_GCU_MOE.pack(gate_up, down, "float32")  # the GCU kernel's [expert, out, in]
    assert stacked.gate_up.shape == [E, 2 * I, H] and stacked.down.shape == [E, H, I]
    np.testing.assert_array_equal(stacked.down.numpy()[4], down[4])
