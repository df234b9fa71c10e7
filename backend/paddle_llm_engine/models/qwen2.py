"""Qwen2 / Qwen2.5 (HF `qwen2`): the Llama decoder with q/k/v biases (always; o_proj has none)."""

from __future__ import annotations

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models.arch import DecoderArch
from paddle_llm_engine.models.llama import LlamaForCausalLM


def refuse_sliding_window(cfg: ModelConfig) -> None:
    """Qwen configs can turn on sliding-window attention for some layers; the paged attention here
    is always full, so such a config is refused rather than run with the wrong attention."""
    if cfg.use_sliding_window:
        raise ValueError(f"{cfg.model_type}: use_sliding_window=true is not supported (full attention only)")


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def arch_for(cfg: ModelConfig) -> DecoderArch:
        refuse_sliding_window(cfg)
        return DecoderArch(qkv_bias=True)
