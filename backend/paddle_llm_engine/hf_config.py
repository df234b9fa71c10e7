"""Reading an HF model folder's config.json (and generation_config.json) into ModelConfig's fields.

Standard library only: config.py builds ModelConfig / MoEConfig from the plain dicts returned here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# HF transformers' defaults for fields a config.json may omit, where a family's config class differs
# from Llama's (LlamaConfig: head_dim hidden/heads, untied, rope_theta 1e4, eps 1e-6, 2048 positions).
# Real checkpoints set these fields; the table only keeps an omitted one from meaning something else here.
_FAMILY_DEFAULTS: dict[str, dict] = {
    "llama": {},
    "qwen2": {"max_position_embeddings": 32768},
    "qwen3": {"head_dim": 128, "max_position_embeddings": 32768},
    "ernie4_5": {"head_dim": 128, "tie_word_embeddings": True, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                 "max_position_embeddings": 131072},
    # The MoE config classes define no head_dim field: HF's attention uses config.json's or hidden / heads.
    "qwen2_moe": {"max_position_embeddings": 32768},
    "qwen3_moe": {"max_position_embeddings": 32768},
    "ernie4_5_moe": {"tie_word_embeddings": True, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                     "max_position_embeddings": 131072},
}
# HF's defaults for the MoE fields of each family's config class (Qwen2MoeConfig, Qwen3MoeConfig,
# Ernie4_5_MoeConfig in transformers 5), under config.json's names.
_MOE_DEFAULTS: dict[str, dict] = {
    "qwen2_moe": {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "norm_topk_prob": False, "decoder_sparse_step": 1},
    "qwen3_moe": {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                  "norm_topk_prob": False, "decoder_sparse_step": 1},
    "ernie4_5_moe": {"moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536, "moe_num_shared_experts": 2,
                     "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1,
                     "moe_norm_min": 1e-12},
}
_LLAMA_DEFAULTS = {"head_dim": None, "tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 2048}


def read_model_fields(model_dir: str | os.PathLike) -> dict:
    """ModelConfig's fields from config.json (+ generation_config.json for EOS ids), under its field
    names; "moe" is a dict of MoEConfig's fields or None (moe_fields). Raises FileNotFoundError
    without config.json, ValueError for a MoE setting that is not supported (moe_fields)."""
    d = Path(model_dir)
    cfg = json.loads((d / "config.json").read_text())
    model_type = cfg.get("model_type", "llama")
    dflt = {**_LLAMA_DEFAULTS, **_FAMILY_DEFAULTS.get(model_type, {})}
    heads = cfg["num_attention_heads"]
    eos = _as_list(cfg.get("eos_token_id"))
    gen_path = d / "generation_config.json"
    if gen_path.is_file():
        gen_eos = _as_list(json.loads(gen_path.read_text()).get("eos_token_id"))
        eos = gen_eos or eos  # generation_config is what HF generate() uses
    max_pos = cfg.get("max_position_embeddings", dflt["max_position_embeddings"])
    rope_theta, rope_scaling = _rope(cfg, dflt["rope_theta"], max_pos)
    return dict(
        model_type=model_type,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or dflt["head_dim"] or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", dflt["rms_norm_eps"]),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=max_pos,
        tie_word_embeddings=cfg.get("tie_word_embeddings", dflt["tie_word_embeddings"]),
        attention_bias=bool(cfg.get("attention_bias", False)),
        eos_token_ids=eos,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        use_bias=bool(cfg.get("use_bias", False)),
        use_sliding_window=bool(cfg.get("use_sliding_window", False)),
        hidden_act=cfg.get("hidden_act", "silu"),
        qkv_bias=bool(cfg.get("qkv_bias", True)),
        moe=moe_fields(cfg, model_type),
    )


def moe_fields(cfg: dict, model_type: str) -> dict | None:
    """The MoEConfig fields of a MoE family's config.json (HF's defaults for omitted fields), None
    for the dense families. Raises ValueError naming a setting HF's model would read differently or that
    is not supported (lists where HF takes one number, as ERNIE-VL's multimodal expert groups)."""
    if model_type not in _MOE_DEFAULTS:
        return None
    dflt = _MOE_DEFAULTS[model_type]
    aliases = {"moe_num_experts": "num_experts", "moe_k": "num_experts_per_tok",  # Ernie4_5_MoeConfig.attribute_map
               "num_experts": "num_local_experts"}                               # Qwen3MoeConfig.attribute_map

    def num(key: str, kind=int):
        v = cfg.get(key, cfg.get(aliases.get(key, ""), dflt.get(key)))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and v != int(v)):
            raise ValueError(f"{model_type}: {key}={v!r} is not supported (one {kind.__name__} expected)")
        return kind(v)

    n_layers = cfg["num_hidden_layers"]
    if model_type == "ernie4_5_moe":
        experts, top_k = num("moe_num_experts"), num("moe_k")
        start, end, interval = num("moe_layer_start_index"), num("moe_layer_end_index"), num("moe_layer_interval")
        end = n_layers - 1 if end == -1 else end
        if interval < 1:
            raise ValueError(f"{model_type}: moe_layer_interval={interval} must be >= 1")
        layers = tuple(i for i in range(n_layers) if (i + 1) % interval == 0 and start <= i <= end)
        shared = num("moe_num_shared_experts")
        moe = dict(router="softmax_bias_topk", shared_intermediate_size=num("moe_intermediate_size") * shared,
                   norm_min=num("moe_norm_min", float))
    else:
        experts, top_k = num("num_experts"), num("num_experts_per_tok")
        step = num("decoder_sparse_step")
        if step < 1:
            raise ValueError(f"{model_type}: decoder_sparse_step={step} must be >= 1")
        dense = cfg.get("mlp_only_layers") or []
        if not isinstance(dense, (list, tuple)) or not all(isinstance(i, int) for i in dense):
            raise ValueError(f"{model_type}: mlp_only_layers={dense!r} is not supported (a list of layer indices)")
        layers = tuple(i for i in range(n_layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
        moe = dict(router="softmax_topk", norm_topk_prob=bool(cfg.get("norm_topk_prob", dflt["norm_topk_prob"])))
        if model_type == "qwen2_moe":
            moe.update(shared_intermediate_size=num("shared_expert_intermediate_size"), shared_expert_gate=True)
    if layers and not 1 <= top_k <= experts:
        raise ValueError(f"{model_type}: {top_k} experts per token of {experts} experts is not supported")
    return dict(num_experts=experts, top_k=top_k, intermediate_size=num("moe_intermediate_size"), layers=layers,
                **moe)


def _rope(cfg: dict, default_theta: float, max_pos: int) -> tuple[float, dict | None]:
    """(rope_theta, normalized rope_scaling or None) from either config.json layout, with HF's precedence:
    `rope_scaling` (transformers 4) wins over `rope_parameters` (transformers 5); a theta inside the
    dict wins over the top-level `rope_theta`; a top-level `partial_rotary_factor` joins the dict."""
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", default_theta)))
    if "partial_rotary_factor" in cfg:
        params.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    params["rope_type"] = params.get("rope_type", params.pop("type", "default"))
    params.pop("type", None)
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        params.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings", max_pos))
    if params == {"rope_type": "default"} or params == {"rope_type": "default", "partial_rotary_factor": 1.0}:
        return theta, None
    return theta, params


def _as_list(v) -> list[int]:
    """An HF token-id field (absent, one id or a list) as a list of ints."""
    if v is None:
        return []
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]
