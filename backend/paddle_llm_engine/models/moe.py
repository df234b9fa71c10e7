"""Mixture-of-experts decoders (HF `ernie4_5_moe`, `qwen3_moe`, `qwen2_moe`): the family's dense
decoder with a sparse MLP block in the layers config.json makes sparse (config.MoEConfig.layers;
the others keep a dense MLP), matching transformers 5's modeling_*_moe.py:

- routing: router logits x @ gate^T, softmax in fp32, top-k experts per token.
  Qwen2/Qwen3-MoE (TopKRouter): logits in the compute dtype, experts by the softmax, weights the
  softmax values, divided by their sum when norm_topk_prob.
  ERNIE 4.5 (Ernie4_5_MoeTopKRouter): gate weight and logits in fp32 whatever the compute dtype
  (HF keeps gate.weight in fp32), experts picked by softmax + e_score_correction_bias [E] (zeros
  when the checkpoint has none, as HF initializes it), weights the plain softmax values divided by
  max(their sum, moe_norm_min).
  The weights are cast to the compute dtype before they scale the experts' outputs.
- experts: SwiGLU MLPs of moe_intermediate_size without biases, run by the OpSet's MoE kernel
  (paddle_llm_ops.moe: tokens grouped by expert, composed or the GCU plug-in's fused one).
- shared expert, added to the routed output: ERNIE `shared_experts` (moe_num_shared_experts x
  moe_intermediate_size wide, biases when use_bias); Qwen2-MoE `shared_expert` scaled by
  sigmoid(x @ shared_expert_gate^T); Qwen3-MoE has none.

Checkpoint layout: the released one (experts.<e>.{gate,up,down}_proj.weight, ERNIE's routing bias
as mlp.moe_statics.e_score_correction_bias [1, E]) or transformers 5's merged tensors
(experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I], mlp.gate.moe_statics....).
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from paddle_llm_engine.config import ModelConfig, MoEConfig
from paddle_llm_engine.models.arch import DecoderArch
from paddle_llm_engine.models.ernie4_5 import Ernie4_5ForCausalLM
from paddle_llm_engine.models.llama import DenseMLP, LlamaForCausalLM, _tensor
from paddle_llm_engine.models.qwen2 import refuse_sliding_window
from paddle_llm_engine.models.qwen3 import Qwen3ForCausalLM
from paddle_llm_engine.models.weights import CheckpointReader


def _optional(r: CheckpointReader, name: str) -> np.ndarray | None:
    try:
        return r.get(name)
    except KeyError:
        return None


def _expert_weights(r: CheckpointReader, m: str, moe: MoEConfig) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per expert: gate_up [2I, H] (gate rows, then up rows) and down [H, I], HF's [out, in] layout."""
    e = moe.num_experts
    gate_up = _optional(r, m + "experts.gate_up_proj")
    if gate_up is not None:  # transformers 5's merged layout
        down = r.get(m + "experts.down_proj")
        if gate_up.shape[0] != e or down.shape[0] != e:
            raise ValueError(f"{m}experts: {gate_up.shape[0]} experts in the checkpoint, config.json says {e}")
        return list(gate_up), list(down)
    gate_up = [np.concatenate([r.get(f"{m}experts.{j}.gate_proj.weight"), r.get(f"{m}experts.{j}.up_proj.weight")])
               for j in range(e)]
    return gate_up, [r.get(f"{m}experts.{j}.down_proj.weight") for j in range(e)]


class SparseMoeBlock:
    """One layer's mixture of experts: x [T, H] -> [T, H] (see the module doc). gate [H, E]
    (fp32 for ERNIE), routing_bias [E] fp32 or None, experts packed by ops.moe_experts, shared:
    DenseMLP or None, shared_gate [H, 1] or None."""

    def __init__(self, r: CheckpointReader, prefix: str, moe: MoEConfig, ops, dtype: str, shared_bias: bool):
        m = prefix
        self.moe, self.ops, self.dtype = moe, ops, dtype
        self.fp32_router = moe.router == "softmax_bias_topk"
        self.gate = _tensor(r.linear(m + "gate.weight"), "float32" if self.fp32_router else dtype)
        self.routing_bias = None
        if self.fp32_router:
            for name in (m + "moe_statics.e_score_correction_bias", m + "gate.moe_statics.e_score_correction_bias"):
                bias = _optional(r, name)
                if bias is not None:
                    self.routing_bias = _tensor(bias.reshape(-1), "float32")
        self.experts = ops.moe_experts.pack(*_expert_weights(r, m, moe), dtype)
        self.shared = self.shared_gate = None
        if moe.shared_intermediate_size:
            sub = "shared_experts." if self.fp32_router else "shared_expert."
            self.shared = DenseMLP(r, m + sub, shared_bias, dtype, ops)
        if moe.shared_expert_gate:
            self.shared_gate = _tensor(r.linear(m + "shared_expert_gate.weight"), dtype)

    def route(self, x: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """x [T, H] -> (topk_ids [T, k] int64 (int32 through the plug-in's routing), topk_weights [T, k]
        in the compute dtype)."""
        k = self.moe.top_k
        if self.fp32_router:
            probs = F.softmax(paddle.matmul(x.astype("float32"), self.gate), axis=-1)
            if self.routing_bias is None:
                _, ids = paddle.topk(probs, k, axis=-1)
            else:
                _, ids = paddle.topk(probs + self.routing_bias, k, axis=-1)
            weights = paddle.take_along_axis(probs, ids, axis=-1)
            weights = weights / paddle.clip(weights.sum(axis=-1, keepdim=True), min=self.moe.norm_min)
        elif self.ops.moe_routing is not None:  # plain softmax top-k: the plug-in's topk_softmax_gcu (fp32)
            weights, ids = self.ops.moe_routing(paddle.matmul(x, self.gate), k, self.moe.norm_topk_prob)
        else:
            probs = F.softmax(paddle.matmul(x, self.gate).astype("float32"), axis=-1)
            weights, ids = paddle.topk(probs, k, axis=-1)
            if self.moe.norm_topk_prob:
                weights = weights / weights.sum(axis=-1, keepdim=True)
        return ids, weights.astype(self.dtype) if self.dtype != "float32" else weights

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        ids, weights = self.route(x)
        out = self.ops.moe_experts(x, ids, weights, self.experts)
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = F.sigmoid(paddle.matmul(x, self.shared_gate)) * s
            out = out + s
        return out


class _MoEDecoder:
    """Mixin: layer i's MLP is a SparseMoeBlock where cfg.moe says so."""

    supports_decode_stack = False  # the decode stack's layers have a dense SwiGLU MLP

    def make_mlp(self, r: CheckpointReader, i: int):
        moe = self.cfg.moe
        if moe is None or i not in moe.layers:
            return None
        return SparseMoeBlock(r, f"model.layers.{i}.mlp.", moe, self.ops, self.dtype, self.arch.mlp_bias)


class Ernie4_5MoeForCausalLM(_MoEDecoder, Ernie4_5ForCausalLM):
    """ERNIE 4.5 MoE (21B-A3B, 300B-A47B): ERNIE 4.5's decoder (interleaved rotary, use_bias)."""

    IGNORED_TENSORS = ("mtp",)  # multi-token-prediction layers, unused by HF's model too


class Qwen3MoeForCausalLM(_MoEDecoder, Qwen3ForCausalLM):
    """Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's decoder (q/k norm); no shared expert."""


class Qwen2MoeForCausalLM(_MoEDecoder, LlamaForCausalLM):
    """Qwen2-MoE / Qwen1.5-MoE: q/k/v biases as config.json's qkv_bias says (default true), no o_proj
    bias, a gated shared expert."""

    @staticmethod
    def arch_for(cfg: ModelConfig) -> DecoderArch:
        refuse_sliding_window(cfg)
        return DecoderArch(qkv_bias=cfg.qkv_bias)
