"""Mixture-of-experts families beyond test_model_families.py (which runs every tiny checkpoint, MoE
ones included, against HF in mixed prefill+decode and chunked-prefill steps):

- a prompt alone: its prefill (3 tokens x top-k < 8 experts) and every decode step leave experts
  without a token, and tokens / logits still equal HF's;
- transformers 5's merged expert tensors load to the same model as the released per-expert layout;
- config.json settings that are not supported, or that disagree with the weights, are refused at
  load, naming the setting or a tensor; omitted MoE fields take HF's defaults per family;
- ERNIE's multi-token-prediction tensors are ignored at load, as HF does.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from test_model_families import LOGIT_ATOL, check, drain, greedy, load_fixture, make_engine, step

import tiny_checkpoints as tc
from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models import build_model
from paddle_llm_engine.models.moe import SparseMoeBlock
from paddle_llm_ops.moe import COMPOSED_MOE, MoEKernel

MOE_FAMILIES = sorted(n for n, (_, cfg, _) in tc.FAMILIES.items() if cfg["model_type"].endswith("_moe"))


def _record_expert_counts(engine) -> list[np.ndarray]:
    """Wrap every MoE layer's expert kernel; returns the list the per-call token counts go to."""
    counts = []

    def run(x, ids, weights, experts):
        counts.append(np.bincount(ids.numpy().ravel(), minlength=experts.num_experts))
        return COMPOSED_MOE.run(x, ids, weights, experts)

    recording = MoEKernel("recording", COMPOSED_MOE.pack, run)
    blocks = [layer.mlp for layer in engine.executor.worker.model.layers if isinstance(layer.mlp, SparseMoeBlock)]
    assert blocks, "no MoE layer"
    for b in blocks:
        b.ops = dataclasses.replace(b.ops, moe_experts=recording)
    return counts


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_idle_experts_in_prefill_and_decode(tmp_path, name):
    ref = load_fixture(name)
    engine = make_engine(str(tc.make_checkpoint(name, tmp_path)))
    counts = _record_expert_counts(engine)
    n_moe = len(engine.executor.worker.model.cfg.moe.layers)
    tokens, rows = {}, {}
    engine.add_request("p0", ref["prompts"][0], greedy(ref["output_ids"].shape[1]))
    step(engine, tokens, rows)  # the 3-token prefill
    prefill = counts[:n_moe]
    drain(engine, tokens, rows)
    assert all((c == 0).any() for c in counts), "every step should leave some of the 8 experts idle"
    assert all(c.sum() == 3 * engine.executor.worker.model.cfg.moe.top_k for c in prefill)
    assert tokens["p0"] == ref["output_ids"][0].tolist()
    assert float(np.abs(np.stack(rows["p0"]) - ref["logits"][0]).max()) < LOGIT_ATOL


def _merge_experts(d, name):
    """Rewrite the checkpoint in transformers 5's merged layout: experts.gate_up_proj [E, 2I, H],
    experts.down_proj [E, H, I], ERNIE's bias under gate.moe_statics."""
    from safetensors.numpy import load_file, save_file

    w = load_file(str(d / "model.safetensors"))
    cfg = tc.config_json(name)
    n = cfg.get("num_experts") or cfg.get("moe_num_experts")
    for m in {k.split("experts.")[0] for k in w if ".experts." in k}:  # "model.layers.<i>.mlp."
        x = m + "experts."
        gu = [np.concatenate([w.pop(f"{x}{e}.gate_proj.weight"), w.pop(f"{x}{e}.up_proj.weight")]) for e in range(n)]
        w[x + "gate_up_proj"] = np.stack(gu)
        w[x + "down_proj"] = np.stack([w.pop(f"{x}{e}.down_proj.weight") for e in range(n)])
        if m + "moe_statics.e_score_correction_bias" in w:
            w[m + "gate.moe_statics.e_score_correction_bias"] = w.pop(m + "moe_statics.e_score_correction_bias")
    save_file(w, str(d / "model.safetensors"))


@pytest.mark.parametrize("name", ["ernie4_5_moe", "qwen2_moe"])
def test_merged_expert_layout_loads_the_same_model(tmp_path, name):
    ref = load_fixture(name)
    d = tc.make_checkpoint(name, tmp_path / "merged")
    _merge_experts(d, name)
    engine = make_engine(str(d))
    tokens, rows = {}, {}
    for i in (0, 1):
        engine.add_request(f"p{i}", ref["prompts"][i], greedy(ref["output_ids"].shape[1]))
    drain(engine, tokens, rows)
    check(name, {**ref, "prompts": ref["prompts"][:2]}, tokens, rows)


def _with_config(tmp_path, name, edit: dict, drop=()):
    d = tc.make_checkpoint(name, tmp_path)
    cfg = {k: v for k, v in json.loads((d / "config.json").read_text()).items() if k not in drop}
    (d / "config.json").write_text(json.dumps({**cfg, **edit}))
    return d


@pytest.mark.parametrize("name, edit, message", [
    ("ernie4_5_moe", {"moe_num_experts": [8, 8]}, r"ernie4_5_moe: moe_num_experts=\[8, 8\] is not supported"),
    ("ernie4_5_moe", {"moe_layer_interval": 0}, "moe_layer_interval=0 must be >= 1"),
    ("qwen3_moe", {"num_experts_per_tok": 9}, "9 experts per token of 8 experts is not supported"),
    ("qwen2_moe", {"mlp_only_layers": "0,2"}, "mlp_only_layers='0,2' is not supported"),
    ("qwen2_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step=0 must be >= 1"),
])
def test_unsupported_moe_settings_are_refused(tmp_path, name, edit, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dir(_with_config(tmp_path, name, edit))


@pytest.mark.parametrize("name, edit, error, message", [
    ("qwen3_moe", {"use_sliding_window": True}, ValueError, "qwen3_moe: use_sliding_window=true is not supported"),
    ("qwen3_moe", {"mlp_only_layers": [0]}, KeyError, "model.layers.2.mlp.gate.weight"),
    ("qwen2_moe", {"decoder_sparse_step": 4}, KeyError, "model.layers.1.mlp.gate_proj.weight"),
    ("ernie4_5_moe", {"moe_num_shared_experts": 0}, ValueError,
     "not used by model_type 'ernie4_5_moe'.*shared_experts"),
    ("qwen2_moe", {"qkv_bias": False}, ValueError, "q_proj.bias"),
])
def test_config_and_weights_disagree(tmp_path, name, edit, error, message):
    d = _with_config(tmp_path, name, edit)
    with pytest.raises(error, match=message):
        build_model(ModelConfig.from_dir(d)).load_weights(str(d))


MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
            "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "moe_num_experts", "moe_k",
            "moe_num_shared_experts", "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval")


@pytest.mark.parametrize("name, want", [
    ("qwen3_moe", dict(num_experts=128, top_k=8, intermediate_size=768, layers=(0, 1, 2, 3), shared_intermediate_size=0,
                       norm_topk_prob=False, router="softmax_topk")),
    ("qwen2_moe", dict(num_experts=60, top_k=4, intermediate_size=1408, layers=(0, 1, 2, 3),
                       shared_intermediate_size=5632, shared_expert_gate=True, norm_topk_prob=False)),
    ("ernie4_5_moe", dict(num_experts=64, top_k=6, intermediate_size=1536, layers=(1, 2, 3, 4),
                          shared_intermediate_size=2 * 1536, norm_min=1e-12, router="softmax_bias_topk")),
])
def test_omitted_moe_fields_take_hf_defaults(tmp_path, name, want):
    cfg = ModelConfig.from_dir(_with_config(tmp_path, name, {}, drop=MOE_KEYS))
    assert {k: getattr(cfg.moe, k) for k in want} == want


def test_ernie_mtp_tensors_are_ignored_like_hf(tmp_path):
    from safetensors.numpy import load_file, save_file

    extra = {"model.mtp_block.0.mlp.up_proj.weight": np.ones((4, 4), np.float32)}
    for name, ok in (("ernie4_5_moe_interval", True), ("qwen3_moe", False)):
        d = tc.make_checkpoint(name, tmp_path / name)
        save_file({**load_file(str(d / "model.safetensors")), **extra}, str(d / "model.safetensors"))
        model = build_model(ModelConfig.from_dir(d))
        if ok:
            model.load_weights(str(d))
        else:
            with pytest.raises(ValueError, match="mtp_block"):
                model.load_weights(str(d))
