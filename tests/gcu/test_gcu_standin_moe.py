"""A mixture-of-experts model on the stand-in `gcu` plug-in (host memory; NOT an Enflame GCU) with
`kernels: composed`: the platform layer turns fused_moe (and every other plug-in kernel) off with that
reason and the composed expert path runs on gcu:0 (routing ids to the host, grouped matmuls through
Paddle's CPU fallback); its greedy tokens equal CPU's and HF's. The fused MoE trio the stand-in
registers is tested in test_gcu_kernels.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tiny_checkpoints as tc
from gcu_helpers import engine_kwargs

REF_DIR = Path(__file__).resolve().parents[1] / "reference"  # fixtures/


def test_moe_on_gcu_runs_the_composed_experts_and_gives_hf_tokens(child, standin_plugin_dir, standin_package,
                                                                   tmp_path):
    name = "qwen2_moe"
    ref = np.load(REF_DIR / "fixtures" / f"tiny_{name}.npz")
    model_dir = str(tc.make_checkpoint(name, tmp_path))
    prompts = tc.prompts()
    spec = {"action": "generate", "prompts": prompts, "max_tokens": 8}
    cpu = child({**spec, "engine": engine_kwargs(model_dir, device="cpu")}, None).ok()
    gcu = child({**spec, "engine": engine_kwargs(model_dir, device="auto", kernels="composed")}, standin_plugin_dir,
                standin_package)
    g = gcu.ok()
    assert g["device"] == "gcu:0" and g["platform_class"] == "GcuPlatform"
    assert "fused_moe: off, kernels set to composed by the operator" in gcu.stderr
    assert g["tokens"] == cpu["tokens"] == [ref["output_ids"][i, :8].tolist() for i in range(len(prompts))]
