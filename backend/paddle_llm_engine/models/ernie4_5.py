"""ERNIE 4.5 dense (HF `ernie4_5`, the 0.3B family): the Llama decoder with interleaved rotary.

From transformers' modeling_ernie4_5.py: rotary pairs dims (2i, 2i+1) ("glm rope style":
cos/sin[:d/2] repeat-interleaved, rotate_half over even/odd dims), run here as rotate-half after
permuting q/k rows at load (see paddle_llm_ops.rotary.interleaved_to_half_order); `use_bias` puts
biases on q/k/v/o and gate/up/down (false in released models); HF defaults differ from Llama's
(tie_word_embeddings true, head_dim 128, rope_theta 500000, rms_norm_eps 1e-5: see config.py).
"""

from __future__ import annotations

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models.arch import DecoderArch
from paddle_llm_engine.models.llama import LlamaForCausalLM


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def arch_for(cfg: ModelConfig) -> DecoderArch:
        b = cfg.use_bias
        return DecoderArch(qkv_bias=b, o_bias=b, mlp_bias=b, rope_interleaved=True)
