"""TensorRT-LLM's per-request LoRA tensors (lora_weights / lora_config) <-> PEFT folders
(paddle_llm_triton/contracts/trtllm_lora.py), against an independent reference: the tensors are
built here by hand from a PEFT adapter (tests/support/lora_adapters.make_adapter) following
TensorRT-LLM's documented layout (its Triton config.pbtxt and examples/hf_lora_convert.py: per
(module, layer) row, A [r, in] flattened then scale * B [out, r] flattened, FP16, zero-padded;
lora_config rows (module_id, layer_idx, r); ids attn_qkv 0, attn_q 1, attn_k 2, attn_v 3,
attn_dense 4, mlp_h_to_4h 5 = gate_proj, mlp_4h_to_h 6 = down_proj, mlp_gate 7 = up_proj), then
converted and compared with the adapter's own A and B scaled; the written PEFT folder goes through
the engine's own adapter reader (the hand-built tensors: tests/support/trtllm_lora_tensors.py); and the malformed inputs each name the input at fault."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file

from lora_adapters import make_adapter
from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.lora.adapter import read_adapter
from paddle_llm_triton.contracts import trtllm_lora as tl
from tiny_checkpoints import make_checkpoint
from trtllm_lora_tensors import TRT_ID, hand_tensors

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """2 layers, hidden 64, head_dim 32: q 128, k / v 64 outputs, intermediate 128."""
    d = make_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3") / "m")
    return d, ModelConfig.from_dir(str(d))


def hand(adapter_dir, r: int, alpha: float):
    """trtllm_lora_tensors.hand_tensors, the adapter's tensors and its scale."""
    w, c = hand_tensors(adapter_dir)
    return w, c, load_file(str(adapter_dir / "adapter_model.safetensors")), alpha / r


def test_hand_built_tensors_convert_to_the_adapters_a_and_scaled_b(qwen3, tmp_path):
    model_dir, cfg = qwen3
    ad = make_adapter(model_dir, tmp_path / "a", seed=1, targets=ALL, r=4, alpha=8.0)
    weights, config, st, scale = hand(ad, 4, 8.0)
    pairs = tl.to_pairs(weights, config, tl.BaseShapes.of(cfg), max_rank=16)
    assert len(pairs) == 2 * 7
    for (layer, module), (a, b) in pairs.items():
        sub = "self_attn" if module in ALL[:4] else "mlp"
        stem = f"base_model.model.model.layers.{layer}.{sub}.{module}"
        want_a = st[stem + ".lora_A.weight"].astype(np.float16)
        want_b = (st[stem + ".lora_B.weight"] * scale).astype(np.float16)
        assert a.shape == want_a.shape and b.shape == want_b.shape, (layer, module)
        np.testing.assert_array_equal(a, want_a)
        np.testing.assert_array_equal(b, want_b)
    # shapes are the base model's: q_proj 64 -> 128, k_proj 64 -> 64, down_proj 128 -> 64
    assert pairs[(0, "q_proj")][1].shape == (128, 4) and pairs[(1, "k_proj")][1].shape == (64, 4)
    assert pairs[(1, "down_proj")][0].shape == (4, 128)


def test_written_folder_is_what_the_engine_reads_with_scale_one(qwen3, tmp_path):
    model_dir, cfg = qwen3
    ad = make_adapter(model_dir, tmp_path / "a", seed=2, targets=ALL, r=8, alpha=32.0)
    weights, config, st, scale = hand(ad, 8, 32.0)
    pairs = tl.to_pairs(weights, config, tl.BaseShapes.of(cfg), max_rank=16)
    tl.write_peft(tmp_path / "peft", pairs)
    adapter = read_adapter("t", str(tmp_path / "peft"), cfg, 16)
    got = {(p.layer, p.module): p for p in adapter.load_pairs()}
    assert set(got) == set(pairs)
    for key, p in got.items():
        assert p.scale == 1.0
        # the engine's delta scale * B (A x) equals the original adapter's (fp16-rounded) delta
        sub = "self_attn" if key[1] in ALL[:4] else "mlp"
        stem = f"base_model.model.model.layers.{key[0]}.{sub}.{key[1]}"
        ref = (st[stem + ".lora_B.weight"] * scale) @ st[stem + ".lora_A.weight"]
        np.testing.assert_allclose(p.b @ p.a, ref, rtol=0, atol=2e-3 * float(np.abs(ref).max()))


def test_round_trip_through_from_peft_is_the_documented_layout(qwen3, tmp_path):
    model_dir, cfg = qwen3
    ad = make_adapter(model_dir, tmp_path / "a", seed=3, targets=("q_proj", "v_proj", "up_proj"), r=2, alpha=3.0)
    weights, config = tl.from_peft(ad, cfg)
    ref_w, ref_c, _, _ = hand(ad, 2, 3.0)
    assert weights.dtype == np.float16 and config.dtype == np.int32
    assert weights.shape == ref_w.shape and config.shape == ref_c.shape == (1, 6, 3)
    got = {tuple(c): w.tobytes() for c, w in zip(config[0].tolist(), weights[0])}
    want = {tuple(c): w.tobytes() for c, w in zip(ref_c[0].tolist(), ref_w[0])}
    assert got == want
    # and back: the same pairs again
    back = tl.to_pairs(weights, config, tl.BaseShapes.of(cfg), 16)
    w2, c2 = tl.from_pairs([_Pair(l, m, a, b) for (l, m), (a, b) in back.items()])
    assert {tuple(c): w.tobytes() for c, w in zip(c2[0].tolist(), w2[0])} == got


class _Pair:
    def __init__(self, layer, module, a, b, scale=1.0):
        self.layer, self.module, self.a, self.b, self.scale = layer, module, a, b, scale


def test_fused_qkv_splits_by_head_counts_with_a_shared_a(qwen3):
    _, cfg = qwen3
    rng = np.random.default_rng(0)
    r, h, q, kv = 3, 64, 128, 64
    a = rng.standard_normal((r, h)).astype(np.float16)
    b = rng.standard_normal((q + 2 * kv, r)).astype(np.float16)
    weights = np.concatenate([a.reshape(-1), b.reshape(-1)])[None, None]
    pairs = tl.to_pairs(weights, np.array([[[0, 1, r]]], np.int32), tl.BaseShapes.of(cfg), 16)
    assert sorted(pairs) == [(1, "k_proj"), (1, "q_proj"), (1, "v_proj")]
    x = rng.standard_normal(h).astype(np.float32)
    fused = b.astype(np.float32) @ (a.astype(np.float32) @ x)
    parts = [pairs[(1, m)][1].astype(np.float32) @ (pairs[(1, m)][0].astype(np.float32) @ x)
             for m in ("q_proj", "k_proj", "v_proj")]
    assert [p.shape[0] for p in parts] == [128, 64, 64]
    np.testing.assert_allclose(np.concatenate(parts), fused, rtol=1e-6)


def test_mixed_ranks_are_written_with_rank_and_alpha_patterns(qwen3, tmp_path):
    _, cfg = qwen3
    rng = np.random.default_rng(1)
    rows, config = [], []
    for module, layer, r in (("q_proj", 0, 4), ("o_proj", 0, 4), ("up_proj", 1, 2)):
        n_in, n_out = tl.BaseShapes.of(cfg).modules[module]
        rows.append(rng.standard_normal(r * (n_in + n_out)).astype(np.float16))
        config.append([TRT_ID[module], layer, r])
    weights = np.zeros((len(rows), max(map(len, rows))), np.float16)
    for i, x in enumerate(rows):
        weights[i, :len(x)] = x
    pairs = tl.to_pairs(weights, np.array(config, np.int32), tl.BaseShapes.of(cfg), 16)
    tl.write_peft(tmp_path / "p", pairs)
    meta = json.loads((tmp_path / "p" / "adapter_config.json").read_text())
    assert meta["r"] == meta["lora_alpha"] == 4 and list(meta["rank_pattern"].values()) == [2]
    adapter = read_adapter("mixed", str(tmp_path / "p"), cfg, 16)
    assert [(l, m, r, s) for l, m, r, s in adapter.modules] == [(0, "o_proj", 4, 1.0), (0, "q_proj", 4, 1.0),
                                                               (1, "up_proj", 2, 1.0)]


def _one_row(cfg, module="q_proj", layer=0, r=2, extra=0):
    n_in, n_out = tl.BaseShapes.of(cfg).modules[module]
    w = np.ones((1, 1, r * (n_in + n_out) + extra), np.float16)
    return w, np.array([[[TRT_ID[module], layer, r]]], np.int32)


def _bad_cases(cfg):
    w, c = _one_row(cfg)
    base = tl.BaseShapes.of(cfg)
    long_w = np.concatenate([w, np.ones((1, 1, 5), np.float16)], axis=2)  # data past the row: another base
    short_w = w[:, :, :-1]
    nan_w = w.copy()
    nan_w[0, 0, 3] = np.nan
    two = np.concatenate([w, w], axis=1)
    return [
        ("weights 1-D", w.reshape(-1), c, "lora_weights"),
        ("config of 4 columns", w, np.zeros((1, 1, 4), np.int32), "lora_config"),
        ("batch of 2", np.concatenate([w, w]), np.concatenate([c, c]), "lora_config"),
        ("row counts differ", two, c, "lora_weights"),
        ("module id 8 (cross attention)", w, np.array([[[8, 0, 2]]], np.int32), "lora_config"),
        ("module id -1", w, np.array([[[-1, 0, 2]]], np.int32), "lora_config"),
        ("layer out of range", w, np.array([[[1, base.num_layers, 2]]], np.int32), "lora_config"),
        ("adapter_size 0", w, np.array([[[1, 0, 0]]], np.int32), "lora_config"),
        ("adapter_size above max_lora_rank", np.ones((1, 1, 17 * 192), np.float16),
         np.array([[[1, 0, 17]]], np.int32), "lora_config"),
        ("row too short for this base", short_w, c, "lora_weights"),
        ("values past the row (another base)", long_w, c, "lora_weights"),
        ("NaN", nan_w, c, "lora_weights"),
        ("integer weights", w.astype(np.int32), c, "lora_weights"),
        ("no rows", np.zeros((1, 0, 4), np.float16), np.zeros((1, 0, 3), np.int32), "lora_config"),
        ("q_proj twice (attn_qkv and attn_q)",
         np.concatenate([np.ones((1, 1, 2 * (64 + 256)), np.float16),
                         np.pad(w, ((0, 0), (0, 0), (0, 2 * (64 + 256) - w.shape[2])))], axis=1),
         np.array([[[0, 0, 2], [1, 0, 2]]], np.int32), "lora_config"),
    ]


def test_malformed_tensors_name_the_input(qwen3):
    _, cfg = qwen3
    base = tl.BaseShapes.of(cfg)
    for what, w, c, field in _bad_cases(cfg):
        with pytest.raises(InvalidRequestError) as ei:
            tl.to_pairs(w, c, base, 16)
        assert ei.value.field == field, (what, str(ei.value))
        assert str(ei.value).startswith(f"{field}: "), what


def test_a_row_for_a_larger_base_says_so(qwen3):
    _, cfg = qwen3
    w, c = _one_row(cfg)
    with pytest.raises(InvalidRequestError, match=r"needs 2 x \(64 \+ 128\) = 384 values, the rows hold 383"):
        tl.to_pairs(w[:, :, :-1], c, tl.BaseShapes.of(cfg), 16)
    with pytest.raises(InvalidRequestError, match="module id 8 is not served"):
        tl.to_pairs(w, np.array([[[8, 0, 2]]], np.int32), tl.BaseShapes.of(cfg), 16)


def test_mlp_of_a_mixture_of_experts_layer_is_refused(tmp_path):
    d = make_checkpoint("qwen3_moe", tmp_path / "moe")
    cfg = ModelConfig.from_dir(str(d))
    base = tl.BaseShapes.of(cfg)
    assert base.moe_layers == {1, 3}
    w, c = _one_row(cfg, "up_proj", layer=1)
    with pytest.raises(InvalidRequestError, match="mixture-of-experts") as ei:
        tl.to_pairs(w, c, base, 16)
    assert ei.value.field == "lora_config"
    w, c = _one_row(cfg, "up_proj", layer=0)  # a dense layer (mlp_only_layers)
    assert set(tl.to_pairs(w, c, base, 16)) == {(0, "up_proj")}


def test_scale_is_folded_once_with_rslora(qwen3, tmp_path):
    """from_peft folds PEFT's rsLoRA scale lora_alpha / sqrt(r) into B, as hf_lora_convert.py does."""
    model_dir, cfg = qwen3
    ad = make_adapter(model_dir, tmp_path / "a", seed=4, targets=("o_proj",), r=4, alpha=6.0, use_rslora=True)
    weights, config = tl.from_peft(ad, cfg)
    st = load_file(str(ad / "adapter_model.safetensors"))
    b = st["base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight"]
    got = tl.to_pairs(weights, config, tl.BaseShapes.of(cfg), 16)[(0, "o_proj")][1]
    np.testing.assert_array_equal(got, (b * (6.0 / math.sqrt(4))).astype(np.float16))
