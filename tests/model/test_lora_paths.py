"""LoRA through each of the engine's CPU paths gives the same rows: the C++ decode stack (rows
grouped per adapter inside the one-call decoder) against the op-by-op path (OpSet.lora_apply), fp32
and wint8, and both against the merged checkpoint (W + scale B A written into the weights: no LoRA
code involved). Steps mix two adapters and the base model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import lora_adapters  # noqa: E402
import tiny_checkpoints  # noqa: E402

from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

FAMILY = "qwen3"  # q/k norms and GQA: the stack's LoRA adds before the norms
PROMPTS = tiny_checkpoints.prompts()[:3]
LORAS = ["a", "b", None]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_paths")
    model = tiny_checkpoints.make_checkpoint(FAMILY, root / "model")
    a = lora_adapters.make_adapter(model, root / "a", seed=3, r=8, magnitude=10.0)
    b = lora_adapters.make_adapter(model, root / "b", seed=4, r=4, targets=("q_proj", "v_proj", "down_proj"),
                                   use_rslora=True, magnitude=10.0)
    merged = {"a": lora_adapters.merge_adapter(model, a, root / "merged_a"),
              "b": lora_adapters.merge_adapter(model, b, root / "merged_b")}
    return model, a, b, merged


def _run(engine: LLMEngine, loras, n_tokens=12):
    """Greedy tokens and the logits behind them, per prompt, all prompts in the same steps."""
    for i, (p, lora) in enumerate(zip(PROMPTS, loras)):
        engine.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True,
                                                      lora_name=lora))
    toks, logits = {}, {}
    while engine.has_unfinished_requests():
        for o in engine.step(return_logits=True):
            toks.setdefault(o.request_id, []).extend(o.token_ids)
            if o.logits is not None:
                logits.setdefault(o.request_id, []).append(np.asarray(o.logits))
    return [toks[str(i)] for i in range(len(loras))], [np.stack(logits[str(i)]) for i in range(len(loras))]


def _engine(model, a, b, stack: bool, **kw) -> LLMEngine:
    e = LLMEngine(EngineConfig(model_dir=str(model), enable_lora=1, lora_modules=f"a={a},b={b}", max_loras=2,
                               max_model_len=256, enable_prefix_caching=0, **kw))
    model_obj = e.executor.worker.model
    assert (model_obj.decode_stack is not None) or not stack
    if not stack:
        model_obj.decode_stack = None  # every step op by op (OpSet.lora_apply)
    return e


@pytest.mark.parametrize("quantization", ["", "wint8", "wint4"])
def test_decode_stack_equals_op_by_op_with_mixed_adapters(folders, quantization):
    model, a, b, _ = folders
    t_stack, l_stack = _run(_engine(model, a, b, True, quantization=quantization), LORAS)
    t_ops, l_ops = _run(_engine(model, a, b, False, quantization=quantization), LORAS)
    assert t_stack == t_ops
    # fp32: the two paths sum the LoRA products in different orders (1e-6); wint8 quantizes each
    # linear's input to int8 per row, so such a difference can flip a rounding step and move later
    # logits by a few hundredths of their spread on this tiny random model.
    bound = 1e-4 if not quantization else 0.1
    for x, y in zip(l_stack, l_ops):
        assert np.abs(x - y).max() <= bound * max(1.0, y.std())


def test_adapters_equal_their_merged_checkpoints(folders):
    model, a, b, merged = folders
    toks, logits = _run(_engine(model, a, b, True), LORAS)
    base = LLMEngine(EngineConfig(model_dir=str(model), max_model_len=256, enable_prefix_caching=0))
    b_toks, b_logits = _run(base, [None] * 3)
    assert toks[2] == b_toks[2]
    np.testing.assert_allclose(logits[2], b_logits[2], atol=1e-4 * b_logits[2].std())
    for i, name in enumerate(("a", "b")):
        m = LLMEngine(EngineConfig(model_dir=str(merged[name]), max_model_len=256, enable_prefix_caching=0))
        m_toks, m_logits = _run(m, [None] * 3)
        assert toks[i] == m_toks[i], name
        assert toks[i] != b_toks[i], f"adapter {name} should change the greedy tokens of prompt {i}"
        assert np.abs(logits[i] - m_logits[i]).max() <= 1e-4 * m_logits[i].std(), name
