"""The 16-bit KV cache (kv_cache_dtype float16 / bfloat16, read by the C++ CPU kernels) on SmolLM2, against the same engine with an fp32 cache, on the 8 reference prompts x 24
greedy tokens (the fp32 engine is itself checked against HF transformers in test_smollm2_reference).

Every K and V value is rounded once when written (relative error <= 2^-9 for bfloat16, 2^-12 for
float16); all arithmetic stays fp32. Stated bounds, from what this model measured (prefill logits max
|diff| 0.014 std bfloat16 and 0.0014 std float16; bfloat16 turned one prompt at its first token (a
near tie), float16 none: first greedy divergence on average after 21.0 and 24 tokens):
- prefill logits within 0.05 std (bfloat16) / 0.005 std (float16) of the fp32 cache's;
- first greedy divergence on average >= 16 tokens (bfloat16) / >= 20 (float16), at least 6 of 8
  prompts identical over all 24 tokens;
- the cache takes half the bytes per block, so the same memory budget holds twice the tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_wint8 import N_TOKENS, _run, fp32_run, reference_prompts

BOUNDS = {"bfloat16": (0.05, 16), "float16": (0.005, 20)}  # (prefill logits / std, mean first divergence)


@pytest.fixture(scope="module")
def runs(smollm2_dir):
    out = {kv: _run(smollm2_dir, reference_prompts(), kv_cache_dtype=kv) for kv in ("bfloat16", "float16")}
    return {"float32": fp32_run(smollm2_dir), **out}


@pytest.mark.parametrize("kv", ["bfloat16", "float16"])
def test_16bit_kv_cache_accuracy_against_fp32(runs, kv):
    e32, t32, l32 = runs["float32"]
    e16, t16, l16 = runs[kv]
    assert e16.executor.plan.kv_cache_dtype == kv and e16.executor.plan.kernels["cpu_kernels"]
    assert str(e16.executor.worker.kv_caches[0][0].dtype).endswith(kv)
    assert e16.executor.worker.model.decode_stack is not None  # decode steps run the stack over the 16-bit cache
    std = float(np.std(np.stack([l32[k][0] for k in l32])))
    prefill = max(float(np.abs(l32[k][0] - l16[k][0]).max()) for k in l32)
    first = [next((i for i, (a, b) in enumerate(zip(t32[k], t16[k])) if a != b), N_TOKENS) for k in t32]
    print(f"kv {kv} vs fp32: prefill logits max |diff| {prefill:.4f} (logit std {std:.2f}, {prefill / std:.3f} std); "
          f"first greedy divergence per prompt {first} (mean {np.mean(first):.1f})")
    bound, divergence = BOUNDS[kv]
    assert 0 < prefill < bound * std
    assert np.mean(first) >= divergence
    assert sum(f == N_TOKENS for f in first) >= 6


def test_16bit_kv_cache_takes_half_the_bytes_per_block(runs):
    per_block = {kv: e.executor.worker.kv_bytes_per_block() for kv, (e, _, _) in runs.items()}
    assert per_block["bfloat16"] == per_block["float16"] == per_block["float32"] // 2
