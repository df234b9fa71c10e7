"""Map an HF `model_type` to our model class; unknown types fail with the supported list."""

from __future__ import annotations

from paddle_llm_engine.config import ModelConfig


def build_model(cfg: ModelConfig):
    from paddle_llm_engine.models.llama import LlamaForCausalLM

    supported = {"llama": LlamaForCausalLM}
    cls = supported.get(cfg.model_type)
    if cls is None:
        raise ValueError(f"model_type {cfg.model_type!r} is not supported (supported: {sorted(supported)})")
    return cls(cfg)
