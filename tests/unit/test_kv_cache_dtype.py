"""kv_cache_dtype bfloat16 / float16 on CPU: storage only (the model computes in fp32), twice the
blocks of an fp32 cache in the same memory budget, greedy tokens equal to the fp32 cache's and
logits within KV_LOGIT_RTOL of them.

Tolerance, stated relative to the standard deviation of the fp32 run's logits: a 16-bit K/V value
carries a relative rounding error of 2^-9 (bf16) or 2^-12 (fp16). On the tiny model (logit std ~8,
see tiny_model.py) the largest logit difference measured over these prompts was 0.034 std (bf16)
and 0.004 std (fp16); the bounds are 0.06 and 0.008 std.
"""

from __future__ import annotations

import numpy as np
import pytest

from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams

KV_LOGIT_RTOL = {"bfloat16": 0.06, "float16": 0.008}
BUDGET = 4 * 2**20
PROMPTS = [[5, 6, 7, 8, 9], list(range(100, 171)), [11] * 3, list(range(300, 340))]


def run(model_dir, kv_cache_dtype):
    engine = LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", block_size=16, max_model_len=256,
                                    kv_cache_memory_bytes=BUDGET, kv_cache_dtype=kv_cache_dtype))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, params)
    tokens, logits = {}, {}
    while engine.has_unfinished_requests():
        for o in engine.step(return_logits=True):
            tokens.setdefault(o.request_id, []).extend(o.token_ids)
            logits.setdefault(o.request_id, []).append(o.logits)
    return engine, tokens, {k: np.stack(v) for k, v in logits.items()}


@pytest.fixture(scope="module")
def fp32_run(tiny_model_dir):
    return run(tiny_model_dir, "float32")


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16"])
def test_16bit_kv_cache_holds_twice_the_blocks_and_matches_fp32(tiny_model_dir, fp32_run, kv_dtype):
    ref_engine, ref_tokens, ref_logits = fp32_run
    engine, tokens, logits = run(tiny_model_dir, kv_dtype)
    assert ref_engine.executor.worker.kv_caches[0][0].dtype.name.lower().endswith("float32")
    assert str(engine.executor.worker.kv_caches[0][0].dtype).endswith(kv_dtype)
    assert engine.executor.plan.dtype == "float32"
    n32, n16 = ref_engine.executor.num_kv_blocks, engine.executor.num_kv_blocks
    assert n16 == 2 * n32, (n16, n32)
    assert engine.executor.worker.kv_bytes_per_block() * 2 == ref_engine.executor.worker.kv_bytes_per_block()
    assert tokens == ref_tokens
    worst = max(float(np.abs(logits[r] - ref_logits[r]).max()) for r in ref_logits)
    print(f"kv {kv_dtype}: max abs logit difference to the fp32 cache {worst:.3g}")
    scale = float(np.std(np.concatenate(list(ref_logits.values()))))
    print(f"logit std {scale:.3g}, relative {worst / scale:.3g}")
    assert 0.0 < worst < KV_LOGIT_RTOL[kv_dtype] * scale
