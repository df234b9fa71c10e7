"""Random LoRA adapters in HF PEFT's format, made with numpy (no torch, no peft), for the tests.

make_adapter(model_dir, out_dir, seed, targets, r, alpha) writes adapter_config.json and
adapter_model.safetensors the way PEFT's save_pretrained does (keys
`base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_{A,B}.weight`, A [r, in] and
B [out, r] fp32), with B non-zero (PEFT initializes B to zero; a trained adapter's is not) and
sized so the adapter moves the logits clearly but keeps them in the model's range.

rank_pattern / alpha_pattern (PEFT's per-module overrides of r / lora_alpha: the first key k
whose regex `(.*\\.)?k$` matches the module's name, e.g. "model.layers.1.self_attn.q_proj", gives
its value) are written into the config and honoured in the tensors' ranks and the scales.

merge_adapter(model_dir, adapter_dir, out_dir) writes a copy of the base checkpoint with every
adapted weight replaced by W + scale * B @ A: an independent path to the adapter's outputs (the
engine runs the merged model with no LoRA code at all).

adapter_sha256(adapter_dir): a digest of the adapter's tensors and config (not of the file bytes, nor
of base_model_name_or_path), to check that a regenerated adapter is the one a fixture was made from.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def _shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    h = cfg["hidden_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * d
    inter = cfg["intermediate_size"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def _moe_layers(cfg: dict) -> set[int]:
    """Layers whose MLP is a mixture of experts (no dense gate/up/down to adapt)."""
    n = cfg["num_hidden_layers"]
    if cfg.get("num_experts") or cfg.get("moe_num_experts"):
        first = cfg.get("moe_layer_start_index", 0)
        last = cfg.get("moe_layer_end_index", -1)  # ERNIE: -1 = the last layer
        last = n - 1 if last is None or last < 0 else last
        step = cfg.get("decoder_sparse_step", cfg.get("moe_layer_interval", 1)) or 1
        dense = set(cfg.get("mlp_only_layers", []))
        return {i for i in range(n) if first <= i <= last and (i + 1) % step == 0 and i not in dense}
    return set()


def _pattern(pattern: dict | None, module_name: str, default):
    """PEFT's rank_pattern / alpha_pattern rule: the value of the first key k (a regex) with
    module_name matching `(.*\\.)?k$`, else default."""
    for key, value in (pattern or {}).items():
        if re.match(rf"(.*\.)?({key})$", module_name):
            return value
    return default


def _scale(alpha: float, r: int, use_rslora: bool) -> float:
    return alpha / math.sqrt(r) if use_rslora else alpha / r


def make_adapter(model_dir: str | Path, out_dir: str | Path, seed: int, targets=ATTN + MLP, r: int = 8,
                 alpha: float = 16.0, use_rslora: bool = False, magnitude: float = 0.5,
                 rank_pattern: dict | None = None, alpha_pattern: dict | None = None) -> Path:
    """Write a PEFT LoRA folder for the model at model_dir; returns out_dir. targets: module names
    (MLP modules are skipped on mixture-of-experts layers); magnitude: the delta's size relative
    to the base weights' spread (|scale * B A x| about magnitude * |W x| for typical x);
    rank_pattern / alpha_pattern: PEFT's per-module r / lora_alpha (module doc)."""
    from safetensors.numpy import save_file

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    shapes = _shapes(cfg)
    moe = _moe_layers(cfg)
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        for m in targets:
            if m in MLP and i in moe:
                continue
            n_in, n_out = shapes[m]
            sub = "self_attn" if m in ATTN else "mlp"
            name = f"model.layers.{i}.{sub}.{m}"
            stem = "base_model.model." + name
            r_m = _pattern(rank_pattern, name, r)
            scale = _scale(_pattern(alpha_pattern, name, alpha), r_m, use_rslora)
            a = rng.standard_normal((r_m, n_in)).astype(np.float32) / math.sqrt(n_in)
            # W's entries are about 0.02 in these models: B so that scale * B A has entries of that order
            b = rng.standard_normal((n_out, r_m)).astype(np.float32) * (magnitude * 0.02 / scale)
            tensors[stem + ".lora_A.weight"] = a
            tensors[stem + ".lora_B.weight"] = b
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir), "r": r,
        "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": sorted(set(targets)), "bias": "none",
        "use_rslora": use_rslora, "use_dora": False, "fan_in_fan_out": False, "inference_mode": True,
        "modules_to_save": None, "rank_pattern": dict(rank_pattern or {}), "alpha_pattern": dict(alpha_pattern or {})},
        indent=1))
    return out


def merge_adapter(model_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Copy the base model folder to out_dir with W + scale * B @ A in every adapted weight
    (fp32 safetensors); returns out_dir."""
    from safetensors.numpy import load_file, save_file

    model_dir, adapter_dir, out = Path(model_dir), Path(adapter_dir), Path(out_dir)
    acfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    lora = load_file(str(adapter_dir / "adapter_model.safetensors"))
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, out / f.name)
    for f in sorted(model_dir.glob("*.safetensors")):
        weights = {k: v.astype(np.float32) for k, v in load_file(str(f)).items()}
        for k in list(weights):
            stem = "base_model.model." + k[: -len(".weight")] if k.endswith(".weight") else None
            if stem and stem + ".lora_A.weight" in lora:
                name = k[: -len(".weight")]
                scale = _scale(_pattern(acfg.get("alpha_pattern"), name, acfg["lora_alpha"]),
                               _pattern(acfg.get("rank_pattern"), name, acfg["r"]), bool(acfg.get("use_rslora")))
                weights[k] = weights[k] + scale * lora[stem + ".lora_B.weight"] @ lora[stem + ".lora_A.weight"]
        save_file(weights, str(out / f.name))
    return out


def adapter_sha256(adapter_dir: str | Path) -> str:
    """sha256 over the adapter's tensors (sorted names, dtype, shape, bytes) and its
    adapter_config.json without base_model_name_or_path (a temporary folder's path)."""
    from safetensors.numpy import load_file

    adapter_dir = Path(adapter_dir)
    h = hashlib.sha256()
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    cfg.pop("base_model_name_or_path", None)
    h.update(json.dumps(cfg, sort_keys=True).encode())
    for name, t in sorted(load_file(str(adapter_dir / "adapter_model.safetensors")).items()):
        h.update(f"{name}|{t.dtype.str}|{list(t.shape)}|".encode())
        h.update(np.ascontiguousarray(t).tobytes())
    return h.hexdigest()
