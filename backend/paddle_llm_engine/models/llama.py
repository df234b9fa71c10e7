"""Llama-architecture decoder (Touvron et al. 2023) in Paddle fp32, over a paged KV cache.

Matches HF transformers' LlamaForCausalLM: RMSNorm pre-norm blocks, rotary embeddings (rotate-half
form), grouped-query attention, SwiGLU MLP, optional tied embeddings. q/k/v are fused into one
matmul and gate/up into another; the attention reads and writes the cache through `paddle_llm_ops`.
"""

from __future__ import annotations

import math

import numpy as np
import paddle
import paddle.nn.functional as F

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models.attention_metadata import AttentionMetadata
from paddle_llm_engine.models.weights import CheckpointReader
from paddle_llm_ops import (RotaryTable, apply_rotary, decode_attention, prefill_attention, rms_norm,
                            write_kv)


def _t(a: np.ndarray) -> paddle.Tensor:
    t = paddle.to_tensor(a)
    t.stop_gradient = True
    return t


class LlamaLayer:
    """Weights of one decoder block: qkv [H, (nh+2kvh)*d], o [nh*d, H], gate_up [H, 2I], down [I, H]."""

    def __init__(self, r: CheckpointReader, i: int, cfg: ModelConfig):
        p = f"model.layers.{i}."
        self.in_norm = _t(r.get(p + "input_layernorm.weight"))
        self.post_norm = _t(r.get(p + "post_attention_layernorm.weight"))
        self.qkv = _t(np.concatenate([r.linear(p + f"self_attn.{x}_proj.weight") for x in "qkv"], axis=1))
        self.qkv_bias = None
        if cfg.attention_bias:
            self.qkv_bias = _t(np.concatenate([r.get(p + f"self_attn.{x}_proj.bias") for x in "qkv"]))
        self.o = _t(r.linear(p + "self_attn.o_proj.weight"))
        self.gate_up = _t(np.concatenate([r.linear(p + "mlp.gate_proj.weight"),
                                          r.linear(p + "mlp.up_proj.weight")], axis=1))
        self.down = _t(r.linear(p + "mlp.down_proj.weight"))


class LlamaForCausalLM:
    """forward(input_ids [T] int64, positions [T] int64, meta, kv_caches) -> hidden [T, H] fp32;
    compute_logits(hidden [B, H]) -> [B, V] fp32."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.layers: list[LlamaLayer] = []

    def load_weights(self, model_dir: str) -> None:
        """Load from HF safetensors; raises KeyError naming a missing tensor."""
        r = CheckpointReader(model_dir)
        cfg = self.cfg
        self.embed = _t(r.get("model.embed_tokens.weight"))  # [V, H]
        self.norm = _t(r.get("model.norm.weight"))
        self.layers = [LlamaLayer(r, i, cfg) for i in range(cfg.num_hidden_layers)]
        # Tied: the logits are h @ embed^T, read from the embedding itself (no second copy).
        self.tied = cfg.tie_word_embeddings
        self.lm_head = self.embed if self.tied else _t(r.get("lm_head.weight"))  # [V, H] either way
        self.rotary = RotaryTable(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)

    def forward(self, input_ids: paddle.Tensor, positions: paddle.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[paddle.Tensor, paddle.Tensor]]) -> paddle.Tensor:
        cfg = self.cfg
        nh, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        t = input_ids.shape[0]
        h = paddle.index_select(self.embed, input_ids, axis=0)  # [T, H]
        cos, sin = self.rotary.lookup(positions)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            x = rms_norm(h, layer.in_norm, cfg.rms_norm_eps)
            qkv = paddle.matmul(x, layer.qkv)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            q, k, v = paddle.split(qkv, [nh * d, kvh * d, kvh * d], axis=-1)
            q = apply_rotary(q.reshape([t, nh, d]), cos, sin)
            k = apply_rotary(k.reshape([t, kvh, d]), cos, sin)
            v = v.reshape([t, kvh, d])
            write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
            attn = self._attention(q, k_cache, v_cache, meta)
            h = h + paddle.matmul(attn, layer.o)
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            h = h + paddle.matmul(F.swiglu(paddle.matmul(x, layer.gate_up)), layer.down)
        return rms_norm(h, self.norm, cfg.rms_norm_eps)

    def _attention(self, q, k_cache, v_cache, meta: AttentionMetadata) -> paddle.Tensor:
        parts = []
        nd = meta.num_decodes
        if nd:
            parts.append(decode_attention(q[:nd], k_cache, v_cache, meta.decode_slots, meta.decode_mask,
                                          self.scale))
        for c in meta.prefills:
            parts.append(prefill_attention(q[c.token_start:c.token_start + c.num_tokens], k_cache, v_cache,
                                           c.context_slots, c.start_pos, self.scale))
        return parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)

    def compute_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:
        return paddle.matmul(hidden, self.lm_head, transpose_y=True)
