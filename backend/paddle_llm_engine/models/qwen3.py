"""Qwen3 dense (HF `qwen3`): the Llama decoder with per-head RMSNorm of q and k (q_norm / k_norm,
weights [head_dim]) before rotary; head_dim is explicit in config.json (e.g. 128 with hidden 1024 /
16 heads), attention_bias (false in released models) puts biases on q/k/v/o as in Llama."""

from __future__ import annotations

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models.arch import DecoderArch
from paddle_llm_engine.models.llama import LlamaForCausalLM
from paddle_llm_engine.models.qwen2 import refuse_sliding_window


class Qwen3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def arch_for(cfg: ModelConfig) -> DecoderArch:
        refuse_sliding_window(cfg)
        return DecoderArch(qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias, qk_norm=True)
