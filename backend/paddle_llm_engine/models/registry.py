"""Map an HF `model_type` to our model class; unknown types fail with the supported list."""

from __future__ import annotations

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models.ernie4_5 import Ernie4_5ForCausalLM
from paddle_llm_engine.models.llama import LlamaForCausalLM
from paddle_llm_engine.models.moe import Ernie4_5MoeForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
from paddle_llm_engine.models.qwen2 import Qwen2ForCausalLM
from paddle_llm_engine.models.qwen3 import Qwen3ForCausalLM

# model_type -> class: all Llama-like decoders (see arch.py), the mixture-of-experts ones with sparse
# MLP layers (moe.py).
SUPPORTED_MODEL_TYPES: dict[str, type] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "ernie4_5": Ernie4_5ForCausalLM,
    "qwen2_moe": Qwen2MoeForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "ernie4_5_moe": Ernie4_5MoeForCausalLM,
}


def model_class(cfg: ModelConfig) -> type:
    """The class of `cfg.model_type`; raises ValueError for an unknown one, naming the supported."""
    cls = SUPPORTED_MODEL_TYPES.get(cfg.model_type)
    if cls is None:
        raise ValueError(f"model_type {cfg.model_type!r} is not supported (supported: {sorted(SUPPORTED_MODEL_TYPES)})")
    return cls


def build_model(cfg: ModelConfig, ops=None, dtype: str = "float32"):
    """The model object for `cfg` (weights not loaded yet), calling the kernels of `ops`
    (paddle_llm_ops.OpSet; None: the composed ops) in compute dtype `dtype`. Raises ValueError for
    an unknown model_type or an option of a known one that is not supported (naming it)."""
    cls = model_class(cfg)
    if ops is None:
        from paddle_llm_ops import COMPOSED as ops
    return cls(cfg, ops, dtype)
