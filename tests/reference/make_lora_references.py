"""Make the HF PEFT fixtures tests/model/test_lora_families.py compares the engine's LoRA against.

Run with the reference venv (torch CPU + transformers + peft, NOT the Paddle venv):

    <ref-venv>/bin/python tests/reference/make_lora_references.py [--family NAME ...] [--out-dir DIR]

For every family of tiny_checkpoints.FAMILIES it writes the tiny random checkpoint and three random
LoRA adapters (tests/support/lora_adapters.make_adapter, numpy; ADAPTERS below) into a temporary
folder, and per adapter loads a fresh HF model (AutoModelForCausalLM, fp32, eager attention) with
peft.PeftModel.from_pretrained(model, adapter_folder) and decodes 16 greedy tokens for each of the 4
prompts of tiny_checkpoints.prompts() with generate(), one prompt at a time, KV cache on, EOS
disabled (as make_tiny_references.py does for the base model, whose fixture tiny_<family>.npz the
engine's base rows are checked against).

PEFT is checked to run exactly the adapter's tensors: every LoRA layer it made holds the file's A and
B (and PEFT's scale per module is recorded), every other LoRA layer it made has B = 0 (no effect).
Mixture-of-experts families: PEFT 0.21 with transformers 5 rewrites a config's gate_proj / up_proj /
down_proj targets into the fused experts' parameters (its transformers v4 -> v5 conversion) and so
drops them on the model's dense MLP layers, which these adapters adapt (the experts they never do:
the engine refuses that). This script turns that conversion off while it loads an adapter
(no_moe_target_conversion), so the dense layers' MLP modules are matched by name as PEFT matches them
on any other model; the shared experts' gate/up/down then match too, get LoRA layers with no tensor in
the file (B = 0, checked) and change nothing.

Writes into tests/reference/fixtures/:
  lora_<family>.npz   (deterministic zip: fixed timestamps; ~135 KB)
    output_ids    [3, 4, 16] int32         greedy tokens per adapter and prompt
    logit_steps   [6] int32                which output positions have their logits row stored
    logits        [3, 4, 6, 512] float32   the raw logits rows behind those tokens
  lora_<family>.json  per adapter its name, make_adapter arguments, lora_adapters.adapter_sha256,
                      PEFT's {module: [r, scale]}, smallest top-1/top-2 gap (all 16 rows), how far it
                      moves the first logits row and how many prompts' tokens differ from the base
                      model's; the base checkpoint's tensors_sha256; versions.

Deterministic: numpy-seeded weights and adapters, fixed thread count, greedy decoding; run twice, the
files are byte-identical.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "support"))  # run in another venv, not by pytest: tiny_checkpoints

import lora_adapters as la  # noqa: E402
import tiny_checkpoints as tc  # noqa: E402
from make_tiny_references import greedy, run_families  # noqa: E402  (this folder: sys.path[0])

# name -> make_adapter arguments (the seed is added per family: FAMILIES seed * 100 + index)
ADAPTERS: tuple[tuple[str, dict], ...] = (
    ("attn", {"targets": list(la.ATTN), "r": 8, "alpha": 16.0}),
    ("all", {"targets": list(la.ATTN + la.MLP), "r": 8, "alpha": 16.0}),
    # rsLoRA, the largest default rank, part of the fused q|k|v and gate|up projections only, and
    # PEFT's per-module rank / alpha overrides (one of them for a single layer's module)
    ("rslora", {"targets": ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], "r": 16, "alpha": 8.0,
                "use_rslora": True, "rank_pattern": {"v_proj": 4, r"model\.layers\.1\.self_attn\.q_proj": 12},
                "alpha_pattern": {"down_proj": 24.0}}),
)
LOGIT_STEPS = (0, 1, 2, 5, 10, 15)


def adapter_specs(family: str) -> list[dict]:
    """[{name, make_adapter kwargs with the seed}] of the family's adapters."""
    seed = tc.FAMILIES[family][0]
    return [{"name": name, "make_adapter": {**kw, "seed": seed * 100 + i + 1}}
            for i, (name, kw) in enumerate(ADAPTERS)]


@contextlib.contextmanager
def no_moe_target_conversion():
    """PEFT's transformers v4 -> v5 config conversion off (module doc)."""
    import peft.utils.transformers_weight_conversion as conv

    orig = conv.convert_peft_config_for_transformers
    conv.convert_peft_config_for_transformers = lambda *a, **kw: None
    try:
        yield
    finally:
        conv.convert_peft_config_for_transformers = orig


def load_peft(model_dir: Path, adapter_dir: Path, family: str):
    """A fresh HF model of model_dir with the adapter loaded by PEFT; (model, {module: [r, scale]})."""
    from peft import PeftModel
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    base.generation_config.eos_token_id = None
    base.config.eos_token_id = None
    moe = bool(tc.FAMILIES[family][2].get("moe"))
    with no_moe_target_conversion() if moe else contextlib.nullcontext():
        model = PeftModel.from_pretrained(base, str(adapter_dir))
    model.eval()
    want = load_file(str(adapter_dir / "adapter_model.safetensors"))
    stems = {k[: -len(".lora_A.weight")] for k in want if k.endswith(".lora_A.weight")}
    scales, seen = {}, set()
    for name, mod in model.named_modules():
        if "default" not in getattr(mod, "lora_A", {}):
            continue
        a, b = mod.lora_A["default"].weight.detach().numpy(), mod.lora_B["default"].weight.detach().numpy()
        if name in stems:
            assert np.array_equal(a, want[name + ".lora_A.weight"]), f"{name}: PEFT's lora_A is not the file's"
            assert np.array_equal(b, want[name + ".lora_B.weight"]), f"{name}: PEFT's lora_B is not the file's"
            seen.add(name)
            scales[name[len("base_model.model."):]] = [int(mod.r["default"]), float(mod.scaling["default"])]
        else:  # a module the target names also match (shared experts), with no tensor in the file
            assert not b.any(), f"{name}: PEFT made a LoRA layer with a non-zero B that the file does not hold"
    assert seen == stems, f"{family}: PEFT did not adapt {sorted(stems - seen)}"
    return model, scales


def save_npz(path: Path, **arrays: np.ndarray) -> None:
    """np.savez_compressed's format (np.load reads it) with fixed timestamps: byte-identical runs."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o600 << 16
            zf.writestr(info, buf.getvalue())


def make_fixture(family: str, out_dir: Path) -> dict:
    import peft
    import safetensors
    import transformers

    prompts = tc.prompts()
    n_new = tc.NUM_NEW_TOKENS
    specs = adapter_specs(family)
    out_ids = np.zeros((len(specs), len(prompts), n_new), np.int32)
    logits = np.zeros((len(specs), len(prompts), len(LOGIT_STEPS), tc.VOCAB), np.float32)
    base_ref = HERE / "fixtures" / f"tiny_{family}.npz"
    base = dict(np.load(base_ref)) if base_ref.is_file() else None
    base_ids = base["output_ids"] if base else None
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tc.make_checkpoint(family, Path(tmp) / "model")
        tensors_sha = tc.tensors_sha256(model_dir)
        for a, spec in enumerate(specs):
            adapter_dir = la.make_adapter(model_dir, Path(tmp) / spec["name"], **spec["make_adapter"])
            spec["sha256"] = la.adapter_sha256(adapter_dir)
            model, spec["peft_modules"] = load_peft(model_dir, adapter_dir, family)
            gap = np.inf
            for i, ids in enumerate(prompts):
                toks, rows = greedy(model, ids, n_new)
                out_ids[a, i] = toks
                logits[a, i] = rows[list(LOGIT_STEPS)]
                top2 = np.sort(rows, axis=-1)[:, -2:]
                gap = min(gap, float((top2[:, 1] - top2[:, 0]).min()))
            spec["min_top1_top2_gap"] = gap  # over all 16 rows, not only the stored ones
            if a == 0 and base_ids is not None:  # the adapter off: PEFT's wrapping leaves the base model as it was
                with model.disable_adapter():
                    toks, _ = greedy(model, prompts[0], n_new)
                assert toks == base_ids[0].tolist(), f"{family}: the base model does not give {base_ref.name}'s tokens"
            spec["logits_abs_max"] = float(np.abs(logits[a]).max())
            if base is not None:  # how far the adapter moves the first row (same prompt, so comparable)
                spec["first_row_max_abs_change"] = float(np.abs(logits[a, :, 0] - base["logits"][:, 0]).max())
                spec["prompts_with_tokens_changed"] = int(sum((out_ids[a, i] != base_ids[i]).any()
                                                              for i in range(len(prompts))))
            del model

    npz = out_dir / f"lora_{family}.npz"
    save_npz(npz, output_ids=out_ids, logit_steps=np.asarray(LOGIT_STEPS, np.int32), logits=logits)
    meta = {
        "description": f"HF PEFT greedy reference for random LoRA adapters on the tiny random {family} checkpoint "
                       "of tests/support/tiny_checkpoints.py; made by tests/reference/make_lora_references.py",
        "family": family,
        "tensors_sha256": tensors_sha,
        "adapters": specs,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "peft_version": peft.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
        "method": "peft.PeftModel.from_pretrained on AutoModelForCausalLM (fp32, eager attention), generate(), "
                  "greedy, all-ones attention mask, EOS disabled, raw logits (output_logits), one prompt at a time"
                  + ("; PEFT's v4 -> v5 MoE target conversion off" if tc.FAMILIES[family][2].get("moe") else ""),
        "max_new_tokens": n_new,
    }
    (out_dir / f"lora_{family}.json").write_text(json.dumps(meta, indent=1) + "\n")
    changed = [(s.get("prompts_with_tokens_changed"), round(s.get("first_row_max_abs_change", 0), 1)) for s in specs]
    print(f"{family}: wrote {npz.name} ({npz.stat().st_size / 1024:.0f} KiB); min top-1/top-2 gap "
          f"{min(s['min_top1_top2_gap'] for s in specs):.4f}; per adapter: prompts whose tokens it changes, "
          f"max |first logits row - base's| {changed}",
          flush=True)
    return meta


def main() -> int:
    return run_families(make_fixture, __doc__)


if __name__ == "__main__":
    sys.exit(main())
