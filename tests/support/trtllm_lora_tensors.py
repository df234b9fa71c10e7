"""TensorRT-LLM's per-request LoRA tensors built by hand from a PEFT folder, for the tests: an
independent reference for paddle_llm_triton/contracts/trtllm_lora.py, written from TensorRT-LLM's
documented layout only (its Triton tensorrt_llm config.pbtxt comments and
examples/hf_lora_convert.py), never from the module under test.

hand_tensors(adapter_dir): (lora_weights [1, N, W] FP16, lora_config [1, N, 3] INT32): one row per
(layer, module) in the adapter, A [r, in] flattened, then B [out, r] multiplied by the PEFT scale
(lora_alpha / r) flattened, zero-padded to the widest row; config rows (module id, layer, r) with
TensorRT-LLM's ids: attn_q 1 = q_proj, attn_k 2, attn_v 3, attn_dense 4 = o_proj, mlp_h_to_4h 5 =
gate_proj, mlp_4h_to_h 6 = down_proj, mlp_gate 7 = up_proj.

fp16_adapter(adapter_dir, out_dir): the PEFT folder of exactly what those FP16 tensors carry (A and
scale * B rounded to FP16, lora_alpha = r so the scale is 1): merged into the base
(lora_adapters.merge_adapter) it is the reference model a request sending hand_tensors must match.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TRT_ID = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4, "gate_proj": 5, "down_proj": 6, "up_proj": 7}


def _pairs(adapter_dir: Path):
    """[(layer, module, A, scale * B)] of a PEFT folder with a single r (make_adapter's)."""
    from safetensors.numpy import load_file

    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / np.sqrt(r) if cfg.get("use_rslora") else alpha / r
    st = load_file(str(adapter_dir / "adapter_model.safetensors"))
    out = []
    for key in sorted(k for k in st if k.endswith("lora_A.weight")):
        parts = key.split(".")  # base_model.model.model.layers.<i>.<sub>.<module>.lora_A.weight
        out.append((int(parts[4]), parts[5], parts[6], st[key], st[key.replace("lora_A", "lora_B")] * scale))
    return out


def hand_tensors(adapter_dir) -> tuple[np.ndarray, np.ndarray]:
    rows, config = [], []
    for layer, _, module, a, b in _pairs(Path(adapter_dir)):
        rows.append(np.concatenate([a.reshape(-1), b.reshape(-1)]).astype(np.float16))
        config.append([TRT_ID[module], layer, a.shape[0]])
    weights = np.zeros((1, len(rows), max(len(x) for x in rows)), np.float16)
    for i, x in enumerate(rows):
        weights[0, i, :len(x)] = x
    return weights, np.array([config], np.int32)


def fp16_adapter(adapter_dir, out_dir) -> Path:
    from safetensors.numpy import save_file

    adapter_dir, out = Path(adapter_dir), Path(out_dir)
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    tensors = {}
    for layer, sub, module, a, b in _pairs(adapter_dir):
        stem = f"base_model.model.model.layers.{layer}.{sub}.{module}"
        tensors[stem + ".lora_A.weight"] = a.astype(np.float16).astype(np.float32)
        tensors[stem + ".lora_B.weight"] = b.astype(np.float16).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    cfg.update(lora_alpha=cfg["r"], use_rslora=False, rank_pattern={}, alpha_pattern={})
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=1))
    return out
