"""LoRA adapters in the HF PEFT format, read and checked against the base model.

A PEFT LoRA folder holds `adapter_config.json` (r, lora_alpha, target_modules, use_rslora,
rank_pattern / alpha_pattern, ...) and `adapter_model.safetensors` with, per adapted Linear of the
base, `base_model.model.<module>.lora_A.weight` [r, in] and `...lora_B.weight` [out, r]; the
adapted Linear computes W x + scale * B (A x), scale = lora_alpha / r (rsLoRA: lora_alpha / sqrt(r);
Hu et al. 2021, Kalajdzievski 2023; PEFT's LoraLayer.update_layer).

read_adapter() checks a folder from its config and the tensors' headers only (no weights read):
every tensor must adapt one of the decoder's projections (q/k/v/o, gate/up/down of a dense MLP) of
an existing layer, with the base model's shapes, and rank <= max_lora_rank. Errors are LoraError
(an InvalidRequestError) naming the adapter and the field. load_pairs() then reads the weights.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.errors import ErrorCode, InvalidRequestError

# The projections an adapter may target, by their HF module name -> the engine's fused linear.
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_MODULES = ATTENTION_MODULES + MLP_MODULES
FUSED_LINEAR = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o",
                "gate_proj": "gate_up", "up_proj": "gate_up", "down_proj": "down"}
# PEFT's name for "every linear but the output head"
ALL_LINEAR = "all-linear"

_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight$")
_CONFIG_FLAGS_REFUSED = {  # adapter_config.json field -> why a true / non-empty value is refused
    "use_dora": "DoRA adapters are not supported",
    "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D-style weights) is not supported for these models",
    "lora_bias": "LoRA biases (lora_bias) are not supported",
}


class LoraError(InvalidRequestError):
    """A LoRA adapter or adapter field the engine cannot use; `field` names the setting or request
    field (lora_modules, lora_name, lora_path, ...), the message names the adapter."""

    def __init__(self, field: str, message: str):
        super().__init__(field, message, ErrorCode.INVALID_LORA)


def module_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """{module: (in, out)} of the base model's projections an adapter may target (whole model, not a
    tensor-parallel shard)."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv, inter = cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def _pattern_value(pattern: dict, module_name: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key k with module_name matching
    `(.*\\.)?k$` gives the value, else default."""
    for key, value in (pattern or {}).items():
        if re.match(rf"(.*\.)?({key})$", module_name):
            return value
    return default


@dataclass(frozen=True)
class LoraPair:
    """One adapted projection: layer index, HF module name, A [r, in] and B [out, r] fp32 as the
    checkpoint stores them (whole, unsharded), and the scale B (A x) is multiplied by."""

    layer: int
    module: str
    a: np.ndarray
    b: np.ndarray
    scale: float


@dataclass(frozen=True)
class LoraAdapter:
    """A checked adapter: name, folder, rank (the largest of its modules), the (layer, module) pairs
    it adapts with their ranks and scales, the target_modules of its config, and lora_id: the
    engine's id of this load (registry.py; 0 until registered)."""

    name: str
    path: str
    rank: int
    modules: tuple[tuple[int, str, int, float], ...]  # (layer, module, r, scale), sorted
    target_modules: tuple[str, ...]
    lora_id: int = 0

    @property
    def linears(self) -> frozenset[str]:
        """The engine's fused linears ("qkv", "o", "gate_up", "down") this adapter changes."""
        return frozenset(FUSED_LINEAR[m] for _, m, _, _ in self.modules)

    def load_pairs(self) -> list[LoraPair]:
        """Read the weights (fp32; fp16 / bf16 widened exactly). Raises LoraError when the folder
        changed since it was checked (a tensor missing or reshaped)."""
        from paddle_llm_engine.models.weights import CheckpointReader

        r = CheckpointReader(self.path)
        out = []
        for layer, module, rank, scale in self.modules:
            sub = "self_attn" if module in ATTENTION_MODULES else "mlp"
            stem = f"base_model.model.model.layers.{layer}.{sub}.{module}."
            try:
                a, b = r.get(stem + "lora_A.weight"), r.get(stem + "lora_B.weight")
            except KeyError as e:
                raise LoraError("lora_path", f"LoRA adapter {self.name!r} at {self.path}: {e.args[0]} (the folder "
                                             f"changed since it was loaded)") from None
            if a.shape[0] != rank or b.shape[1] != rank:
                raise LoraError("lora_path", f"LoRA adapter {self.name!r} at {self.path}: {stem}lora_A / lora_B "
                                             f"changed shape since it was loaded")
            out.append(LoraPair(layer, module, a, b, scale))
        return out


def _read_config(name: str, folder: Path) -> dict:
    cfg_path = folder / "adapter_config.json"
    if not folder.is_dir():
        raise LoraError("lora_path", f"LoRA adapter {name!r}: {str(folder)!r} is not a folder")
    if not cfg_path.is_file():
        raise LoraError("lora_path", f"LoRA adapter {name!r}: no adapter_config.json in {folder} (a PEFT LoRA "
                                     f"folder holds adapter_config.json and adapter_model.safetensors)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoraError("lora_path", f"LoRA adapter {name!r}: {cfg_path} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise LoraError("lora_path", f"LoRA adapter {name!r}: {cfg_path} is not a JSON object")
    return cfg


def _check_config(name: str, cfg: dict) -> tuple[float, bool, dict, dict, tuple[str, ...]]:
    """(lora_alpha, use_rslora, rank_pattern, alpha_pattern, target module names) of a config."""
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoraError("peft_type", f"LoRA adapter {name!r}: peft_type {peft_type!r} is not supported (LORA only)")
    for key, why in _CONFIG_FLAGS_REFUSED.items():
        if cfg.get(key):
            raise LoraError(key, f"LoRA adapter {name!r}: {why}")
    if str(cfg.get("bias", "none")) != "none":
        raise LoraError("bias", f"LoRA adapter {name!r}: bias {cfg.get('bias')!r} is not supported (none only: the "
                                f"adapter may not change the base model's biases)")
    alpha = cfg.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise LoraError("lora_alpha", f"LoRA adapter {name!r}: lora_alpha must be a number, got {alpha!r}")
    targets = cfg.get("target_modules")
    names: tuple[str, ...] = ()
    if isinstance(targets, list):
        names = tuple(str(t) for t in targets)
        unknown = [t for t in names if t.rsplit(".", 1)[-1] not in SUPPORTED_MODULES]
        if unknown:
            raise LoraError("target_modules", f"LoRA adapter {name!r}: target modules {unknown} are not projections "
                                              f"this engine adapts (supported: {', '.join(SUPPORTED_MODULES)})")
    elif targets is not None and not isinstance(targets, str):
        raise LoraError("target_modules", f"LoRA adapter {name!r}: target_modules must be a list or a string, "
                                          f"got {type(targets).__name__}")
    for key in ("rank_pattern", "alpha_pattern"):
        if not isinstance(cfg.get(key) or {}, dict):
            raise LoraError(key, f"LoRA adapter {name!r}: {key} must be an object")
    return float(alpha), bool(cfg.get("use_rslora", False)), cfg.get("rank_pattern") or {}, \
        cfg.get("alpha_pattern") or {}, names


def _tensor_shapes(name: str, folder: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of adapter_model.safetensors, from its header (weights not read)."""
    st = folder / "adapter_model.safetensors"
    if not st.is_file():
        extra = " (adapter_model.bin is refused: loading it would run pickled code)" \
            if (folder / "adapter_model.bin").exists() else ""
        raise LoraError("lora_path", f"LoRA adapter {name!r}: no adapter_model.safetensors in {folder}{extra}")
    try:
        with open(st, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= 100 << 20:
                raise ValueError(f"header size {n}")
            header = json.loads(f.read(n))
        return {k: tuple(int(x) for x in v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise LoraError("lora_path", f"LoRA adapter {name!r}: {st} is not a safetensors file ({e})") from None


def _tensors_by_module(name: str, shapes: dict[str, tuple[int, ...]], model: ModelConfig,
                       moe_layers: frozenset[int]) -> dict[tuple[int, str], dict[str, tuple[int, ...]]]:
    """{(layer, module): {"A" | "B": shape}} of an adapter's tensors; LoraError (target_modules,
    lora_path) for a tensor that adapts nothing this engine adapts, or is not 2-D."""
    found: dict[tuple[int, str], dict[str, tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        m = _KEY.match(key)
        if m is None:
            raise LoraError("target_modules", f"LoRA adapter {name!r}: tensor {key!r} adapts a module this engine does "
                                              f"not adapt (supported: {', '.join(SUPPORTED_MODULES)} of the decoder "
                                              f"layers; no embeddings, LM head, experts or DoRA magnitudes)")
        layer, sub, module, which = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if module not in SUPPORTED_MODULES or (sub == "self_attn") != (module in ATTENTION_MODULES):
            raise LoraError("target_modules", f"LoRA adapter {name!r}: tensor {key!r} adapts {sub}.{module}, which "
                                              f"this model does not have")
        if layer >= model.num_hidden_layers:
            raise LoraError("target_modules", f"LoRA adapter {name!r}: tensor {key!r} adapts layer {layer}; the base "
                                              f"model has {model.num_hidden_layers} layers (an adapter for another "
                                              f"base model?)")
        if module in MLP_MODULES and layer in moe_layers:
            raise LoraError("target_modules", f"LoRA adapter {name!r}: tensor {key!r} adapts {module} of layer "
                                              f"{layer}, a mixture-of-experts layer (adapters of experts are not "
                                              f"supported)")
        if len(shape) != 2:
            raise LoraError("lora_path", f"LoRA adapter {name!r}: tensor {key!r} has shape {list(shape)}, not 2-D")
        found.setdefault((layer, module), {})[which] = shape
    return found


def read_adapter(name: str, path: str, model: ModelConfig, max_lora_rank: int,
                 moe_layers: frozenset[int] = frozenset()) -> LoraAdapter:
    """Check the PEFT LoRA folder `path` against `model` and return the LoraAdapter `name`.

    moe_layers: decoder layers whose MLP is a mixture of experts (an adapter may not target their
    gate/up/down). Raises LoraError naming the adapter and the field: lora_path (missing folder or
    file, not JSON / safetensors, a tensor with no partner), target_modules (a module the model does
    not have or this engine does not adapt), r (rank 0 or above max_lora_rank), and the shape of a
    tensor that differs from the base model's (an adapter trained for another base)."""
    if not name or not isinstance(name, str):
        raise LoraError("lora_name", f"a LoRA adapter name must be a non-empty string, got {name!r}")
    folder = Path(path)
    cfg = _read_config(name, folder)
    alpha, rslora, rank_pattern, alpha_pattern, targets = _check_config(name, cfg)
    shapes = _tensor_shapes(name, folder)
    expected = module_shapes(model)
    found = _tensors_by_module(name, shapes, model, moe_layers)
    if not found:
        raise LoraError("lora_path", f"LoRA adapter {name!r}: adapter_model.safetensors holds no LoRA tensors")
    modules = []
    max_rank = 0
    for (layer, module), ab in sorted(found.items()):
        stem = f"base_model.model.model.layers.{layer}.{'self_attn' if module in ATTENTION_MODULES else 'mlp'}.{module}"
        if set(ab) != {"A", "B"}:
            missing = "lora_B" if "A" in ab else "lora_A"
            raise LoraError("lora_path", f"LoRA adapter {name!r}: {stem}.{missing}.weight is missing")
        (ra, a_in), (b_out, rb) = ab["A"], ab["B"]
        base_in, base_out = expected[module]
        if ra != rb:
            raise LoraError("r", f"LoRA adapter {name!r}: {stem} has lora_A rank {ra} and lora_B rank {rb}")
        if (a_in, b_out) != (base_in, base_out):
            raise LoraError("lora_path", f"LoRA adapter {name!r}: {stem} maps {a_in} -> {b_out} features; the base "
                                         f"model's {module} maps {base_in} -> {base_out} (an adapter for another "
                                         f"base model?)")
        if not 0 < ra <= max_lora_rank:
            raise LoraError("r", f"LoRA adapter {name!r}: {stem} has rank {ra}, above max_lora_rank {max_lora_rank}"
                            if ra > 0 else f"LoRA adapter {name!r}: {stem} has rank 0")
        module_name = f"model.layers.{layer}.{'self_attn' if module in ATTENTION_MODULES else 'mlp'}.{module}"
        r_cfg = _pattern_value(rank_pattern, module_name, cfg.get("r", ra))
        if r_cfg != ra:
            raise LoraError("r", f"LoRA adapter {name!r}: {stem} has rank {ra}, adapter_config.json says {r_cfg}")
        a = float(_pattern_value(alpha_pattern, module_name, alpha))
        scale = a / math.sqrt(ra) if rslora else a / ra
        modules.append((layer, module, ra, scale))
        max_rank = max(max_rank, ra)
    return LoraAdapter(name, str(folder), max_rank, tuple(modules), targets)
