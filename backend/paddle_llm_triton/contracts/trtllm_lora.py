"""TensorRT-LLM's per-request LoRA tensors <-> the HF PEFT LoRA folders the engine loads.

TensorRT-LLM's Triton inputs (inflight_batcher_llm tensorrt_llm config.pbtxt; the engine side's
runtime/loraUtils.cpp checks): `lora_config` INT32 [N, 3], one row per (module, layer) adapted:
(module_id, layer_idx, adapter_size r); `lora_weights` [N, W] in the base model's dtype (FP16 in the
Triton configs), row i = A.flatten() then B.flatten(), A [r, in] ("in" weights, adapter_size first)
and B [out, r] ("out" weights, out dim first), zero-padded to the widest row W. Both may carry a
leading batch dim of 1. TensorRT-LLM's converter (examples/hf_lora_convert.py) folds the PEFT scale
(lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora) into B, so the tensors hold A and
scale * B and the delta is simply B (A x).

Module ids (tensorrt_llm LoraManager.LORA_MODULE_IDS) and their HF projection in Llama-style models
(hf_lora_convert.py's mapping): 0 attn_qkv (q | k | v fused: B's rows split by the head counts, A
shared), 1 attn_q = q_proj, 2 attn_k = k_proj, 3 attn_v = v_proj, 4 attn_dense = o_proj,
5 mlp_h_to_4h = gate_proj, 6 mlp_4h_to_h = down_proj, 7 mlp_gate = up_proj.

to_pairs() checks a request's tensors against the base model and returns the PEFT pairs;
write_peft() writes them as a PEFT folder (scale 1: r and lora_alpha equal per module);
from_pairs() / from_peft() build the tensors from a PEFT adapter (what hf_lora_convert.py makes).
Errors are InvalidRequestError naming the input (lora_weights, lora_config).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError

MODULE_IDS = {"attn_qkv": 0, "attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4, "mlp_h_to_4h": 5,
              "mlp_4h_to_h": 6, "mlp_gate": 7}
MODULE_NAMES = {v: k for k, v in MODULE_IDS.items()}
HF_MODULE = {1: "q_proj", 2: "k_proj", 3: "v_proj", 4: "o_proj", 5: "gate_proj", 6: "down_proj", 7: "up_proj"}
MODULE_ID_OF = {hf: mid for mid, hf in HF_MODULE.items()}
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_SUPPORTED_TEXT = ", ".join(f"{i} {n}" for n, i in MODULE_IDS.items())


@dataclass(frozen=True)
class BaseShapes:
    """What the tensors are checked against: layers, {HF module: (in, out)} of the whole (unsharded)
    model, and the decoder layers whose MLP is a mixture of experts (no dense gate/up/down)."""

    num_layers: int
    modules: dict
    moe_layers: frozenset = frozenset()

    @classmethod
    def of(cls, model_config) -> "BaseShapes":
        """From the engine's ModelConfig."""
        from paddle_llm_engine.lora.adapter import module_shapes

        moe = getattr(model_config, "moe", None)
        return cls(model_config.num_hidden_layers, module_shapes(model_config),
                   frozenset(moe.layers) if moe is not None else frozenset())


def _bad(field: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(field, message, ErrorCode.INVALID_LORA)


def _unbatch(arr: np.ndarray, field: str) -> np.ndarray:
    """[1, N, X] or [N, X] -> [N, X]."""
    arr = np.asarray(arr)
    if arr.ndim == 3:
        if arr.shape[0] != 1:
            raise _bad(field, f"expected batch dimension to be 1 for each LoRA request, got shape {list(arr.shape)}")
        arr = arr[0]
    if arr.ndim != 2:
        raise _bad(field, f"must be 2-D [N, ...] (or [1, N, ...]), got shape {list(arr.shape)}")
    return arr


def _check_tensors(weights, config) -> tuple[np.ndarray, np.ndarray]:
    config = _unbatch(config, "lora_config")
    weights = _unbatch(weights, "lora_weights")
    if config.shape[1] != 3 or not np.issubdtype(config.dtype, np.integer):
        raise _bad("lora_config", f"must be INT32 [N, 3] (module_id, layer_idx, adapter_size) rows, got "
                                  f"{config.dtype} {list(config.shape)}")
    if not np.issubdtype(weights.dtype, np.floating):
        raise _bad("lora_weights", f"must be floating point (FP16), got {weights.dtype}")
    if config.shape[0] == 0:
        raise _bad("lora_config", "has no rows (one per adapted module and layer)")
    if weights.shape[0] != config.shape[0]:
        raise _bad("lora_weights", f"has {weights.shape[0]} rows, lora_config {config.shape[0]}: one row of weights "
                                   f"per lora_config row")
    if not np.isfinite(weights).all():
        raise _bad("lora_weights", "holds NaN or infinite values")
    return weights, config


def _targets(module_id: int, layer: int, row: int, base: BaseShapes) -> list[tuple[str, int]]:
    """[(HF module, first row of B)] that module_id adapts; raises for an id or layer not served."""
    if module_id not in MODULE_NAMES:
        raise _bad("lora_config", f"row {row}: module id {module_id} is not served (supported: {_SUPPORTED_TEXT})")
    if not 0 <= layer < base.num_layers:
        raise _bad("lora_config", f"row {row}: layer {layer} is out of range [0, {base.num_layers}) (an adapter for "
                                  f"another base model?)")
    if module_id == 0:
        q, kv = base.modules["q_proj"][1], base.modules["k_proj"][1]
        return [("q_proj", 0), ("k_proj", q), ("v_proj", q + kv)]
    hf = HF_MODULE[module_id]
    if hf not in _ATTENTION and layer in base.moe_layers:
        raise _bad("lora_config", f"row {row}: {MODULE_NAMES[module_id]} of layer {layer}, a mixture-of-experts "
                                  f"layer (adapters of experts are not supported)")
    return [(hf, 0)]


def to_pairs(weights, config, base: BaseShapes, max_rank: int) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """{(layer, HF module): (A [r, in], B [out, r])} of a request's lora_weights / lora_config (B
    already scaled, as TensorRT-LLM's tensors hold it; the weights' dtype kept). Raises
    InvalidRequestError naming lora_weights or lora_config."""
    weights, config = _check_tensors(weights, config)
    width = weights.shape[1]
    pairs: dict = {}
    for i, (module_id, layer, r) in enumerate(config.tolist()):
        targets = _targets(module_id, layer, i, base)
        name = MODULE_NAMES[module_id]
        if not 0 < r <= max_rank:
            raise _bad("lora_config", f"row {i}: adapter_size {r} of {name} must be in 1..{max_rank} (max_lora_rank)")
        n_in = base.modules[targets[0][0]][0]
        n_out = sum(base.modules[m][1] for m, _ in targets)
        need = r * (n_in + n_out)
        if need > width:
            raise _bad("lora_weights", f"row {i} ({name}, layer {layer}, adapter_size {r}) needs {r} x ({n_in} + "
                                       f"{n_out}) = {need} values, the rows hold {width} (an adapter for another "
                                       f"base model?)")
        if np.any(weights[i, need:]):
            raise _bad("lora_weights", f"row {i} ({name}, layer {layer}, adapter_size {r}) has non-zero values past "
                                       f"its {r} x ({n_in} + {n_out}) = {need}: its layout is not this base "
                                       f"model's (an adapter for another base model?)")
        a = weights[i, :r * n_in].reshape(r, n_in)
        b = weights[i, r * n_in:need].reshape(n_out, r)
        for module, first in targets:
            if (layer, module) in pairs:
                raise _bad("lora_config", f"row {i}: {module} of layer {layer} is adapted twice")
            pairs[(layer, module)] = (a, b[first:first + base.modules[module][1]])
    return pairs


def _stem(layer: int, module: str) -> str:
    return f"base_model.model.model.layers.{layer}.{'self_attn' if module in _ATTENTION else 'mlp'}.{module}"


def write_peft(folder: str | Path, pairs: dict) -> int:
    """Write `pairs` (to_pairs) as a PEFT LoRA folder whose scale is 1 for every module (r and
    lora_alpha equal; modules of another rank through rank_pattern / alpha_pattern). Returns the
    bytes of adapter_model.safetensors."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors, ranks = {}, {}
    for (layer, module), (a, b) in sorted(pairs.items()):
        tensors[_stem(layer, module) + ".lora_A.weight"] = np.ascontiguousarray(a)
        tensors[_stem(layer, module) + ".lora_B.weight"] = np.ascontiguousarray(b)
        ranks[_stem(layer, module)[len("base_model.model."):]] = int(a.shape[0])
    r = Counter(ranks.values()).most_common(1)[0][0]
    pattern = {re.escape(name): rank for name, rank in ranks.items() if rank != r}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": r, "use_rslora": False,
        "target_modules": sorted({m for _, m in pairs}), "bias": "none", "lora_dropout": 0.0,
        "rank_pattern": pattern, "alpha_pattern": dict(pattern), "inference_mode": True}, indent=1))
    return (folder / "adapter_model.safetensors").stat().st_size


def from_pairs(pairs, dtype=np.float16) -> tuple[np.ndarray, np.ndarray]:
    """TensorRT-LLM's (lora_weights [1, N, W], lora_config [1, N, 3] INT32) of PEFT pairs: an iterable
    of (layer, HF module, A [r, in], B [out, r], scale) (the engine's lora.adapter.LoraPair has
    these fields); the scale is folded into B, rows ordered by (layer, module id)."""
    rows, config = [], []
    for p in sorted(pairs, key=lambda p: (p.layer, MODULE_ID_OF[p.module])):
        b = np.asarray(p.b, np.float32) * np.float32(p.scale)
        rows.append(np.concatenate([np.asarray(p.a, np.float32).reshape(-1), b.reshape(-1)]).astype(dtype))
        config.append([MODULE_ID_OF[p.module], p.layer, int(p.a.shape[0])])
    width = max(len(r) for r in rows)
    weights = np.zeros((1, len(rows), width), dtype)
    for i, r in enumerate(rows):
        weights[0, i, :len(r)] = r
    return weights, np.asarray([config], np.int32)


def from_peft(path: str | Path, model_config, max_rank: int = 1024, dtype=np.float16) -> tuple[np.ndarray, np.ndarray]:
    """A PEFT LoRA folder (checked against the base model's ModelConfig as the engine checks it) ->
    TensorRT-LLM's (lora_weights, lora_config), as hf_lora_convert.py makes them."""
    from paddle_llm_engine.lora.adapter import read_adapter

    moe = getattr(model_config, "moe", None)
    adapter = read_adapter("trtllm-export", str(path), model_config, max_rank,
                           frozenset(moe.layers) if moe is not None else frozenset())
    return from_pairs(adapter.load_pairs(), dtype)
