"""Map an HF `model_type` to our model class; unknown types fail with the supported list."""

from __future__ import annotations

import importlib

from paddle_llm_engine.config import ModelConfig

# model_type -> (module under paddle_llm_engine.models, class): all Llama-like decoders (see arch.py),
# the mixture-of-experts ones with sparse MLP layers (moe.py).
SUPPORTED_MODEL_TYPES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "ernie4_5": ("ernie4_5", "Ernie4_5ForCausalLM"),
    "qwen2_moe": ("moe", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("moe", "Qwen3MoeForCausalLM"),
    "ernie4_5_moe": ("moe", "Ernie4_5MoeForCausalLM"),
}


def model_class(cfg: ModelConfig) -> type:
    """The class of `cfg.model_type`; raises ValueError for an unknown one, naming the supported."""
    entry = SUPPORTED_MODEL_TYPES.get(cfg.model_type)
    if entry is None:
        raise ValueError(f"model_type {cfg.model_type!r} is not supported (supported: {sorted(SUPPORTED_MODEL_TYPES)})")
    module, name = entry
    return getattr(importlib.import_module(f"paddle_llm_engine.models.{module}"), name)


def build_model(cfg: ModelConfig, ops=None, dtype: str = "float32"):
    """The model object for `cfg` (weights not loaded yet), calling the kernels of `ops`
    (paddle_llm_ops.OpSet; None: the composed ops) in compute dtype `dtype`. Raises ValueError for
    an unknown model_type or an option of a known one that is not supported (naming it)."""
    cls = model_class(cfg)
    if ops is None:
        from paddle_llm_ops import COMPOSED as ops
    return cls(cfg, ops, dtype)
