"""Mixture-of-experts expert compute: every (token, expert) pair of a step through its expert's SwiGLU
MLP, weighted by the router and summed per token. Routing itself (which experts, which weights) is
the model's (paddle_llm_engine.models.moe); the kernels here only run the experts.

Two kernels with one interface (MoEKernel); which one an engine uses is the platform layer's
decision (paddle_llm_engine.platforms, kernel "fused_moe"), made once at start:
- COMPOSED_MOE: plain Paddle ops, every place. The step's token-expert pairs are sorted by expert
  (a stable argsort of the top-k ids, on the host: T*k integers), the tokens gathered in that order,
  one gate_up matmul, SwiGLU and down matmul per expert that received tokens (experts without a
  token are skipped; never a loop over tokens), and the results gathered back into (token, slot)
  order through the inverse permutation, weighted and summed over the k slots.
- FUSED_GCU_MOE: the GCU plug-in's fused MoE operators (paddle-custom-gcu's custom ops
  moe_align_block_size_gcu and fused_moe_kernel_gcu, called as FastDeploy's GCUFusedMoeMethod
  calls them: align the pairs to blocks of BLOCK_M rows, gate_up kernel, SwiGLU, down kernel with
  the routing weights applied, sum over the k slots). No GCU is available to this repository's
  tests: only the decision to use it is tested, not the call.

Expert weights arrive as HF stores them per expert (Linear [out, in]): gate_up [2I, H] (gate rows
first, then up) and down [H, I]; each kernel's `pack` lays them out as its `run` wants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import paddle
import paddle.nn.functional as F

from paddle_llm_ops.host_tensor import from_numpy
# Rows per block of the GCU kernel (FastDeploy's GCU MoE config BLOCK_SIZE_M).
BLOCK_M = 32


def _tensor(a: np.ndarray, dtype: str) -> paddle.Tensor:
    t = from_numpy(np.ascontiguousarray(a))
    if dtype != "float32":
        t = t.astype(dtype)
    t.stop_gradient = True
    return t


@dataclass
class ExpertWeights:
    """One layer's routed experts as a kernel packed them. Composed: lists of per-expert
    gate_up [H, 2I] and down [I, H] (x @ W form); fused GCU: stacked gate_up [E, 2I, H] and
    down [E, H, I] (the kernel's [expert, out, in] layout)."""

    num_experts: int
    intermediate_size: int
    gate_up: list | paddle.Tensor
    down: list | paddle.Tensor


def pack_per_expert(gate_up: list[np.ndarray], down: list[np.ndarray], dtype: str) -> ExpertWeights:
    return ExpertWeights(len(gate_up), down[0].shape[1], [_tensor(w.T, dtype) for w in gate_up],
                         [_tensor(w.T, dtype) for w in down])


def pack_stacked(gate_up: list[np.ndarray], down: list[np.ndarray], dtype: str) -> ExpertWeights:
    return ExpertWeights(len(gate_up), down[0].shape[1], _tensor(np.stack(gate_up), dtype),
                         _tensor(np.stack(down), dtype))


def group_by_expert(topk_ids: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """topk_ids [T, k] -> (order [T*k]: the (token, slot) pairs, flattened row-major, sorted by
    expert (stable: token order within an expert); counts [E]: pairs per expert; inverse [T*k]:
    where each pair went, so that grouped[inverse] is back in (token, slot) order)."""
    flat = topk_ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    counts = np.bincount(flat, minlength=num_experts)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return order, counts, inverse


def moe_experts_composed(x: paddle.Tensor, topk_ids: paddle.Tensor, topk_weights: paddle.Tensor,
                         experts: ExpertWeights) -> paddle.Tensor:
    """x [T, H]; topk_ids [T, k] int64; topk_weights [T, k] in x's dtype -> [T, H] =
    sum over slots j of topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])."""
    t, k = topk_ids.shape
    order, counts, inverse = group_by_expert(topk_ids.numpy(), experts.num_experts)
    xs = paddle.index_select(x, from_numpy(order // k))  # [T*k, H], grouped by expert
    outs, start = [], 0
    for e in np.flatnonzero(counts):  # experts that received no token are skipped
        n = int(counts[e])
        h = F.swiglu(paddle.matmul(xs[start:start + n], experts.gate_up[e]))
        outs.append(paddle.matmul(h, experts.down[e]))
        start += n
    y = outs[0] if len(outs) == 1 else paddle.concat(outs, axis=0)
    y = paddle.index_select(y, from_numpy(inverse)).reshape([t, k, x.shape[1]])
    return (y * topk_weights.unsqueeze(-1)).sum(axis=1)


def moe_experts_fused_gcu(x: paddle.Tensor, topk_ids: paddle.Tensor, topk_weights: paddle.Tensor,
                          experts: ExpertWeights) -> paddle.Tensor:
    """As moe_experts_composed, through the GCU plug-in's fused MoE operators (see the module doc)."""
    from paddle.base import core

    run = core.eager._run_custom_op
    t, hidden = x.shape
    k = topk_ids.shape[1]
    e, inter = experts.num_experts, experts.intermediate_size
    ids = topk_ids.astype("int32")
    weights = topk_weights.astype("float32")
    padded = t * k + e * (BLOCK_M - 1)
    sorted_ids = paddle.empty([padded], dtype="int32")
    expert_ids = paddle.zeros([padded // BLOCK_M], dtype="int32")
    num_post_pad = paddle.empty([1], dtype="int32")
    sorted_ids, expert_ids, num_post_pad = run("moe_align_block_size_gcu", sorted_ids, expert_ids, num_post_pad,
                                               ids, e, BLOCK_M)
    gate_up = paddle.empty([t, k, 2 * inter], dtype=x.dtype)
    run("fused_moe_kernel_gcu", gate_up, x, experts.gate_up, None, weights, ids, sorted_ids, expert_ids,
        num_post_pad, False, k, BLOCK_M)
    h = F.swiglu(gate_up.reshape([t * k, 2 * inter]))
    out = paddle.empty([t, k, hidden], dtype=x.dtype)
    run("fused_moe_kernel_gcu", out, h, experts.down, None, weights, ids, sorted_ids, expert_ids,
        num_post_pad, True, 1, BLOCK_M)
    return out.sum(axis=1)


@dataclass(frozen=True)
class MoEKernel:
    """pack(gate_up [E] of [2I, H], down [E] of [H, I] numpy, dtype) -> ExpertWeights;
    calling it runs the experts: (x, topk_ids, topk_weights, experts) -> [T, H]."""

    name: str
    pack: Callable
    run: Callable

    def __call__(self, x, topk_ids, topk_weights, experts):
        return self.run(x, topk_ids, topk_weights, experts)


COMPOSED_MOE = MoEKernel("composed", pack_per_expert, moe_experts_composed)
FUSED_GCU_MOE = MoEKernel("fused_gcu", pack_stacked, moe_experts_fused_gcu)
