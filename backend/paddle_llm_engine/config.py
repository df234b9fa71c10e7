"""Engine configuration (what the operator sets) and model configuration (read from config.json)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ModelConfig:
    """Architecture hyper-parameters from an HF `config.json` (Llama family field names)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> "ModelConfig":
        """Read config.json (+ generation_config.json for EOS ids). Raises FileNotFoundError."""
        d = Path(model_dir)
        cfg = json.loads((d / "config.json").read_text())
        heads = cfg["num_attention_heads"]
        eos = _as_list(cfg.get("eos_token_id"))
        gen_path = d / "generation_config.json"
        if gen_path.is_file():
            gen_eos = _as_list(json.loads(gen_path.read_text()).get("eos_token_id"))
            eos = gen_eos or eos  # generation_config is what HF generate() uses
        return cls(
            model_type=cfg.get("model_type", "llama"),
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling"),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", False),
            eos_token_ids=eos,
        )


def _as_list(v) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]


@dataclass
class EngineConfig:
    """Operator settings of one engine (one per Triton model instance).

    model_dir: HF folder (config.json, *.safetensors, tokenizer files).
    device: "cpu" or "gcu:<id>" ("auto" picks gcu:<device_id> when the plug-in is present).
    block_size: tokens per KV block.
    num_kv_blocks: KV blocks; 0 means size from kv_cache_memory_bytes.
    kv_cache_memory_bytes: budget for K+V of all layers when num_kv_blocks is 0.
    max_num_seqs: sequences in one step (decode batch limit).
    max_num_batched_tokens: tokens in one step (prefill chunk budget).
    max_model_len: prompt + output limit per sequence; 0 means the model's max_position_embeddings.
    num_threads: CPU threads for Paddle kernels; 0 means all cores.
    """

    model_dir: str
    device: str = "auto"
    device_id: int = 0
    block_size: int = 64
    num_kv_blocks: int = 0
    kv_cache_memory_bytes: int = 1 << 30
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 0
    num_threads: int = 0
    seed: int = 0

    def validate(self, model: ModelConfig) -> None:
        """Resolve defaults against the model and check ranges; raises ValueError naming the field."""
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if self.max_model_len <= 0:
            self.max_model_len = model.max_position_embeddings
        if self.max_model_len > model.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{model.max_position_embeddings}"
            )
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be > 0, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs})"
            )
        if self.num_kv_blocks < 0 or self.kv_cache_memory_bytes <= 0:
            raise ValueError("num_kv_blocks must be >= 0 and kv_cache_memory_bytes > 0")
