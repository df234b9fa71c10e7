"""LoRA inside the C++ decode stack on every dispatch path (generic, AVX2 + FMA, AVX-512 VNNI where
this CPU has it, skipped with the reason where not): a decode step whose rows use two adapters and
the base model gives what the op-by-op path (OpSet.lora_apply, Paddle matmuls) gives, fp32 and over
int8 / int4 base weights; base rows are bit-identical to a step without LoRA."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.lora.adapter import read_adapter
from paddle_llm_engine.lora.registry import LoraLoad
from paddle_llm_engine.lora.weights import LoraWeights
from test_cpu_decode_stack import checkpoints, load, run_both  # noqa: F401 (checkpoints: a fixture)
from test_cpu_kernels import ISA_PARAMS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import lora_adapters  # noqa: E402

ROW_SLOTS = np.array([0, -1, 1, 0, -1], np.int32)  # adapters in slots 0 and 1, two base rows
CONTEXTS = [5, 17, 33, 2, 40]


@pytest.fixture(scope="module")
def adapters(checkpoints, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("stack_lora")
    model_dir = checkpoints["qwen3"]
    a = lora_adapters.make_adapter(model_dir, root / "a", seed=5, r=8, magnitude=10.0)
    b = lora_adapters.make_adapter(model_dir, root / "b", seed=6, r=4, targets=("k_proj", "o_proj", "up_proj"),
                                   magnitude=10.0)
    cfg = ModelConfig.from_dir(model_dir)
    return model_dir, [replace(read_adapter(n, str(p), cfg, 16), lora_id=i + 1)
                        for i, (n, p) in enumerate((("a", a), ("b", b)))]


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("quantization", ["", "wint8", "wint4"])
def test_stack_lora_equals_op_by_op(adapters, isa, quantization):
    model_dir, loaded = adapters
    model = load(model_dir, isa, quantization)
    weights = LoraWeights(model, max_loras=2, max_cpu_loras=2, dtype="float32")
    assert weights.stack_table is not None
    for slot, adapter in enumerate(loaded):
        weights.load(LoraLoad(slot, adapter))
    base_out, _, _, _ = run_both(model, CONTEXTS, seed=3)
    model.lora_batch = weights.batch(ROW_SLOTS)
    try:
        out, ref, kv, kv_ref = run_both(model, CONTEXTS, seed=3)
    finally:
        model.lora_batch = None
    # fp32: the two paths sum the LoRA products in other orders; int8 activations can turn such a
    # difference into a rounding step of the quantized input
    tol = 1e-4 if not quantization else 5e-2
    np.testing.assert_allclose(out, ref, atol=tol * max(1.0, float(np.abs(ref).max())))
    for (k, v), (k_ref, v_ref) in zip(kv, kv_ref):
        np.testing.assert_allclose(k.numpy(), k_ref.numpy(), atol=tol * 10)
        np.testing.assert_allclose(v.numpy(), v_ref.numpy(), atol=tol * 10)
    base_rows = ROW_SLOTS < 0
    np.testing.assert_array_equal(out[base_rows], base_out[base_rows])  # no adapter: untouched bit for bit
    assert np.abs(out[~base_rows] - base_out[~base_rows]).max() > 1e-2  # the adapters do act
