"""PEFT LoRA folders checked against the base model (lora/adapter.py read_adapter): every refusal
names the adapter and the field (LoraError.field) and, where one is to blame, the tensor; the
scale per module equals the one HF PEFT computed for the same folder (rank_pattern / alpha_pattern,
rsLoRA), as recorded in the fixtures tests/reference/fixtures/lora_<family>.json
(make_lora_references.py)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.lora import LoraError, read_adapter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import lora_adapters as la  # noqa: E402
import tiny_checkpoints as tc  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "reference" / "fixtures"
STEM = "base_model.model.model.layers.{}.self_attn.{}"
NAME = "my-adapter"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(model folder, ModelConfig, a good adapter folder: q/k/v/o/gate/up/down, r 4) of llama_untied."""
    root = tmp_path_factory.mktemp("lora_adapter")
    model = tc.make_checkpoint("llama_untied", root / "model")
    good = la.make_adapter(model, root / "good", seed=3, r=4, alpha=8.0)
    return model, ModelConfig.from_dir(str(model)), good


@pytest.fixture
def adapter(base, tmp_path):
    """A changeable copy of the good adapter: (folder, edit_config(**fields), edit_tensors(fn))."""
    folder = tmp_path / "adapter"
    shutil.copytree(base[2], folder)

    def edit_config(**fields):
        cfg = json.loads((folder / "adapter_config.json").read_text())
        cfg.update(fields)
        (folder / "adapter_config.json").write_text(json.dumps(cfg))

    def edit_tensors(fn):
        t = load_file(str(folder / "adapter_model.safetensors"))
        fn(t)
        save_file(t, str(folder / "adapter_model.safetensors"))

    return folder, edit_config, edit_tensors


def refused(base, folder, field: str, *in_message: str, max_lora_rank: int = 16, moe_layers=frozenset(),
            model: ModelConfig | None = None) -> LoraError:
    with pytest.raises(LoraError) as e:
        read_adapter(NAME, str(folder), model or base[1], max_lora_rank, moe_layers)
    err = e.value
    assert err.field == field, f"field {err.field!r}, want {field!r}: {err}"
    assert f"'{NAME}'" in err.message, f"the message does not name the adapter: {err.message}"
    for text in in_message:
        assert text in err.message, f"{text!r} not in {err.message!r}"
    return err


def test_the_good_adapter_is_read_with_its_modules(base):
    a = read_adapter(NAME, str(base[2]), base[1], 16)
    assert a.name == NAME and a.rank == 4 and len(a.modules) == 2 * 7
    assert {m for _, m, _, _ in a.modules} == set(la.ATTN + la.MLP)
    assert all(r == 4 and s == 2.0 for _, _, r, s in a.modules)
    assert a.linears == {"qkv", "o", "gate_up", "down"}


# -- the folder and its files ----------------------------------------------------------------
def test_missing_folder(base, tmp_path):
    refused(base, tmp_path / "nowhere", "lora_path", "is not a folder")


def test_missing_adapter_config(base, adapter):
    folder, _, _ = adapter
    (folder / "adapter_config.json").unlink()
    refused(base, folder, "lora_path", "no adapter_config.json")


def test_adapter_model_bin_only_is_refused(base, adapter):
    folder, _, _ = adapter
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.bin").write_bytes(b"\x80\x02}q\x00.")  # a pickle: never loaded
    refused(base, folder, "lora_path", "no adapter_model.safetensors", "adapter_model.bin is refused")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\xff\xfe"])
def test_bad_adapter_config(base, adapter, text):
    folder, _, _ = adapter
    (folder / "adapter_config.json").write_bytes(text.encode("latin-1"))
    refused(base, folder, "lora_path", "adapter_config.json")


def test_not_a_safetensors_file(base, adapter):
    folder, _, _ = adapter
    (folder / "adapter_model.safetensors").write_bytes(b"\x00" * 16)
    refused(base, folder, "lora_path", "is not a safetensors file")


# -- the config's settings -------------------------------------------------------------------
@pytest.mark.parametrize("fields, field, message", [
    ({"use_dora": True}, "use_dora", "DoRA"),
    ({"bias": "lora_only"}, "bias", "'lora_only'"),
    ({"bias": "all"}, "bias", "'all'"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save", "modules_to_save"),
    ({"fan_in_fan_out": True}, "fan_in_fan_out", "fan_in_fan_out"),
    ({"peft_type": "IA3"}, "peft_type", "'IA3'"),
    ({"lora_alpha": "sixteen"}, "lora_alpha", "'sixteen'"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "target_modules", "embed_tokens"),
    ({"target_modules": ["v_proj", "lm_head"]}, "target_modules", "lm_head"),
    ({"r": 8}, "r", "adapter_config.json says 8"),
])
def test_config_refusals(base, adapter, fields, field, message):
    folder, edit_config, _ = adapter
    edit_config(**fields)
    refused(base, folder, field, message)


def test_rank_above_max_lora_rank(base, tmp_path):
    folder = la.make_adapter(base[0], tmp_path / "r32", seed=4, r=32, targets=("q_proj",))
    refused(base, folder, "r", "rank 32, above max_lora_rank 16", STEM.format(0, "q_proj"))
    assert read_adapter(NAME, str(folder), base[1], 32).rank == 32


# -- the tensors -----------------------------------------------------------------------------
@pytest.mark.parametrize("module", ["model.embed_tokens", "lm_head"])
def test_tensor_of_a_module_the_engine_does_not_adapt(base, adapter, module):
    folder, _, edit_tensors = adapter

    def add(t):
        t[f"base_model.model.{module}.lora_A.weight"] = np.zeros((4, 64), np.float32)
        t[f"base_model.model.{module}.lora_B.weight"] = np.zeros((512, 4), np.float32)

    edit_tensors(add)
    refused(base, folder, "target_modules", module)


def test_tensor_shape_of_another_base(base, adapter):
    folder, _, edit_tensors = adapter
    key = STEM.format(1, "k_proj") + ".lora_B.weight"

    def other(t):
        t[key] = np.zeros((64, 4), np.float32)  # k_proj of this base has 2 KV heads x 16 = 32 outputs

    edit_tensors(other)
    refused(base, folder, "lora_path", STEM.format(1, "k_proj"), "64 features", "-> 32")


def test_layer_out_of_range(base, adapter):
    folder, _, edit_tensors = adapter

    def move(t):
        for ab in "AB":
            t[STEM.format(7, "q_proj") + f".lora_{ab}.weight"] = t.pop(STEM.format(1, "q_proj") + f".lora_{ab}.weight")

    edit_tensors(move)
    refused(base, folder, "target_modules", STEM.format(7, "q_proj"), "layer 7", "2 layers")


@pytest.mark.parametrize("drop, missing", [("B", "lora_B"), ("A", "lora_A")])
def test_one_factor_without_the_other(base, adapter, drop, missing):
    folder, _, edit_tensors = adapter
    edit_tensors(lambda t: t.pop(STEM.format(0, "o_proj") + f".lora_{drop}.weight"))
    refused(base, folder, "lora_path", STEM.format(0, "o_proj") + f".{missing}.weight is missing")


def test_factors_of_different_ranks(base, adapter):
    folder, _, edit_tensors = adapter

    def cut(t):
        k = STEM.format(0, "v_proj") + ".lora_A.weight"
        t[k] = np.ascontiguousarray(t[k][:2])

    edit_tensors(cut)
    refused(base, folder, "r", STEM.format(0, "v_proj"), "lora_A rank 2 and lora_B rank 4")


def test_no_lora_tensors(base, adapter):
    folder, _, _ = adapter
    save_file({}, str(folder / "adapter_model.safetensors"))
    refused(base, folder, "lora_path", "holds no LoRA tensors")


# -- mixture of experts ------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "ernie4_5_moe", "ernie4_5_moe_interval"])
def test_mlp_targets_on_moe_layers_are_refused(family, tmp_path):
    model = tc.make_checkpoint(family, tmp_path / "model")
    cfg = ModelConfig.from_dir(str(model))
    moe_layers = frozenset(cfg.moe.layers)
    # make_adapter leaves the MoE layers' MLP out: accepted, dense layers' MLP adapted
    good = la.make_adapter(model, tmp_path / "good", seed=5, r=4)
    a = read_adapter(NAME, str(good), cfg, 16, moe_layers)
    assert {layer for layer, m, _, _ in a.modules if m in la.MLP} == set(range(cfg.num_hidden_layers)) - moe_layers
    # the same adapter with a MoE layer's gate_proj added
    layer = min(moe_layers)
    t = load_file(str(good / "adapter_model.safetensors"))
    stem = f"base_model.model.model.layers.{layer}.mlp.gate_proj"
    t[stem + ".lora_A.weight"] = np.zeros((4, tc.HIDDEN), np.float32)
    t[stem + ".lora_B.weight"] = np.zeros((cfg.intermediate_size, 4), np.float32)
    save_file(t, str(good / "adapter_model.safetensors"))
    refused(None, good, "target_modules", stem, f"layer {layer}", "mixture-of-experts", model=cfg,
            moe_layers=moe_layers)


def test_an_engine_refuses_an_adapter_of_moe_experts_at_start(tmp_path):
    """The engine hands the model's MoE layers to the check: the start fails naming the adapter."""
    from paddle_llm_engine import EngineConfig, LLMEngine

    model = tc.make_checkpoint("qwen2_moe", tmp_path / "model")
    bad = la.make_adapter(model, tmp_path / "bad", seed=6, r=4, targets=("q_proj",))
    t = load_file(str(bad / "adapter_model.safetensors"))
    stem = "base_model.model.model.layers.1.mlp.down_proj"  # layer 1 is sparse (decoder_sparse_step 2)
    t[stem + ".lora_A.weight"] = np.zeros((4, tc.INTERMEDIATE), np.float32)
    t[stem + ".lora_B.weight"] = np.zeros((tc.HIDDEN, 4), np.float32)
    save_file(t, str(bad / "adapter_model.safetensors"))
    with pytest.raises(LoraError) as e:
        LLMEngine(EngineConfig(model_dir=str(model), device="cpu", num_kv_blocks=8, max_model_len=64,
                               num_threads=1, enable_lora=1, lora_modules=f"experts={bad}"))
    assert e.value.field == "target_modules" and "'experts'" in e.value.message and stem in e.value.message


# -- scales: PEFT's, per module ------------------------------------------------------------------
@pytest.mark.parametrize("family", sorted(tc.FAMILIES))
def test_scale_per_module_equals_peft(family, tmp_path):
    """rank_pattern / alpha_pattern / use_rslora: for every adapter of the fixtures, the (layer,
    module, rank, scale) read_adapter finds equal what PEFT built for the same folder."""
    path = FIXTURES / f"lora_{family}.json"
    if not path.is_file():
        pytest.fail(f"{path} missing: run tests/reference/make_lora_references.py with the reference venv",
                    pytrace=False)
    meta = json.loads(path.read_text())
    model = tc.make_checkpoint(family, tmp_path / "model")
    cfg = ModelConfig.from_dir(str(model))
    moe_layers = frozenset(cfg.moe.layers) if cfg.moe is not None else frozenset()
    patterns = 0
    for spec in meta["adapters"]:
        folder = la.make_adapter(model, tmp_path / spec["name"], **spec["make_adapter"])
        assert la.adapter_sha256(folder) == spec["sha256"], f"{spec['name']}: not the fixture's adapter"
        a = read_adapter(spec["name"], str(folder), cfg, 16, moe_layers)
        got = {f"model.layers.{layer}.{'self_attn' if m in la.ATTN else 'mlp'}.{m}": [r, s]
               for layer, m, r, s in a.modules}
        assert got.keys() == spec["peft_modules"].keys()
        for module, (r, s) in spec["peft_modules"].items():
            assert got[module][0] == r and got[module][1] == pytest.approx(s, rel=1e-12), module
        patterns += len({tuple(v) for v in got.values()}) > 1
    assert patterns >= 1, "no adapter of the fixture has per-module ranks or scales"
