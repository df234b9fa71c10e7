"""What distinguishes the Llama-like decoder families the engine runs: a small set of switches.

Every supported family is a pre-norm RMSNorm decoder with grouped-query attention, rotary
positions and a SwiGLU MLP (`llama.LlamaForCausalLM` implements it once); each family module only
says which of these options its checkpoints use, derived from its config.json.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderArch:
    qkv_bias: bool = False          # q/k/v projections carry biases (Qwen2 always; Llama/Qwen3 attention_bias)
    o_bias: bool = False            # o_proj carries a bias (Llama/Qwen3 attention_bias, ERNIE use_bias)
    mlp_bias: bool = False          # gate/up/down carry biases (Llama mlp_bias, ERNIE use_bias)
    qk_norm: bool = False           # per-head RMSNorm of q and k (weights [head_dim]) before rotary (Qwen3)
    rope_interleaved: bool = False  # rotary pairs dims (2i, 2i+1) (GPT-J/GLM style, ERNIE 4.5), not (i, i+d/2)
