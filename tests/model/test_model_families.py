"""Every supported model family against HF transformers (torch CPU, fp32, eager attention), on tiny
random checkpoints: Llama tied / untied with llama3 rope_scaling and biases, Qwen2, Qwen2 with yarn,
Qwen3 (q/k norm, explicit head_dim), ERNIE 4.5 (interleaved rotary, explicit head_dim), and the
mixture-of-experts families Qwen3-MoE, Qwen2-MoE (shared expert with its gate) and ERNIE 4.5 MoE
(routing bias, shared experts; and one with moe_layer_interval 2, k=3, no bias), dense and MoE
layers mixed (test_moe_families.py has the MoE-only checks).

The checkpoints are not committed: tests/support/tiny_checkpoints.py regenerates each one with
numpy into tmp_path, and its tensors' sha256 must equal the one recorded when the fixture was made
(tests/reference/fixtures/tiny_<family>.json), so a changed generator asks for new fixtures instead
of failing obscurely. Fixtures: tests/reference/make_tiny_references.py in the reference venv.

Checked per family, for 4 prompts (3 / 12 / 37 / 70 tokens) x 16 greedy tokens:
- every greedy token equals HF's;
- every logits row behind those tokens (all 512 entries) agrees within LOGIT_ATOL (max abs diff).
Scheduling is part of it: test_mixed_prefill_and_decode prefills 2 prompts in the first step and
then mixes their decodes with the other 2 prompts' prefills; test_chunked_prefill uses a 16-token
step budget so prompts are split into chunks that share steps with decodes.

Measured on the 2-core dev machine (paddle 3.3.1 CPU vs torch 2.13.0 CPU, transformers 5.24.0),
logits being O(10-40) (|max| 34-44), max abs diff over all 64 rows per family, mixed / chunked:
  llama_tied 9.0e-5 / 9.6e-5, llama_untied 2.7e-5 / 2.8e-5, qwen2 4.8e-5 / 4.3e-5,
  qwen2_yarn 5.6e-5 / 5.4e-5, qwen3 1.04e-4 / 1.05e-4, ernie4_5 5.5e-5 / 6.0e-5;
  (4-5 layers) qwen3_moe 2.4e-4 / 3.1e-4, qwen2_moe 1.3e-4 / 9.9e-5, ernie4_5_moe 2.5e-4 / 1.8e-4,
  ernie4_5_moe_interval 2.7e-4 / 1.4e-4 (the composed kernels; mixed, chunked).
LOGIT_ATOL = 1e-3 (as for SmolLM2) leaves ~10x margin for other CPUs / BLAS paths; a real error
(wrong rotary pairing or scaling, missing bias or norm, wrong head_dim) moves logits by O(1) and
flips tokens (checked by breaking ERNIE's interleaved rotary and yarn's attention factor; for MoE
by dropping ERNIE's routing bias or shared experts, flipping norm_topk_prob, dropping Qwen2-MoE's
shared-expert gate, using k-1 experts: each flips tokens in 3 or 4 of the 4 prompts). The smallest
top-1/top-2 gap in the fixtures is 0.0099 (ernie4_5_moe), so greedy tokens are stable under it; the
smallest routing margin (k-th vs (k+1)-th expert, relative, see make_tiny_references.RoutingStats)
is 6e-4, far above rounding, so both sides route every token to the same experts.
The tensors' sha256 is checked rather than the file's (also recorded) so that a safetensors release
that encodes the header differently does not invalidate the fixtures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams

import tiny_checkpoints as tc

REF_DIR = Path(__file__).resolve().parents[1] / "reference"  # fixtures/

LOGIT_ATOL = 1e-3
BLOCK = 16
MAX_LEN = 128


def load_fixture(family: str) -> dict:
    path = REF_DIR / "fixtures" / f"tiny_{family}.npz"
    if not path.is_file():
        pytest.fail(f"{path} missing: run tests/reference/make_tiny_references.py with the reference venv",
                    pytrace=False)
    d = dict(np.load(path))
    d["meta"] = json.loads(path.with_suffix(".json").read_text())
    d["prompts"] = [d["prompt_ids"][i, :n].tolist() for i, n in enumerate(d["prompt_lens"])]
    return d


@pytest.fixture(scope="module", params=sorted(tc.FAMILIES))
def family(request, tmp_path_factory):
    """(name, checkpoint folder, fixture) per family; the folder is regenerated and checked once."""
    name = request.param
    ref = load_fixture(name)
    model_dir = tc.make_checkpoint(name, tmp_path_factory.mktemp(f"tiny_{name}"))
    regen = "regenerate the fixtures: <ref-venv>/bin/python tests/reference/make_tiny_references.py"
    assert tc.config_json(name) == ref["meta"]["config"], f"{name}: config.json differs from the fixture's; {regen}"
    assert tc.tensors_sha256(model_dir) == ref["meta"]["tensors_sha256"], (
        f"{name}: tiny_checkpoints.py now makes different weights than the fixture was made from; {regen}")
    assert ref["prompts"] == tc.prompts()
    return name, str(model_dir), ref


def make_engine(model_dir: str, **kw) -> LLMEngine:
    cfg = dict(model_dir=model_dir, device="cpu", block_size=BLOCK, num_kv_blocks=48, max_model_len=MAX_LEN,
               max_num_seqs=8, max_num_batched_tokens=256, num_threads=2,
               kv_cache_dtype="float32")  # the model path against HF in fp32; 16-bit KV: test_kv_cache_16bit.py
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n)


def step(engine: LLMEngine, tokens: dict, rows: dict) -> set[str]:
    outs = engine.step(return_logits=True)
    for o in outs:
        assert len(o.token_ids) == 1
        tokens.setdefault(o.request_id, []).extend(o.token_ids)
        rows.setdefault(o.request_id, []).append(o.logits)
    return {o.request_id for o in outs}


def drain(engine: LLMEngine, tokens: dict, rows: dict) -> None:
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        step(engine, tokens, rows)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "KV blocks leaked"


def check(name: str, ref: dict, tokens: dict, rows: dict) -> float:
    """Assert tokens and all logits rows; return the max abs logits diff."""
    worst = 0.0
    errors = []
    for i in range(len(ref["prompts"])):
        got, want = tokens.get(f"p{i}", []), ref["output_ids"][i].tolist()
        if got != want:
            k = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            errors.append(f"prompt {i} ({ref['prompt_lens'][i]} tokens): first mismatch at output {k}: "
                          f"got {got[k:k + 4]}, HF {want[k:k + 4]}")
            continue
        diff = float(np.abs(np.stack(rows[f"p{i}"]) - ref["logits"][i]).max())
        worst = max(worst, diff)
        assert diff < LOGIT_ATOL, f"{name} prompt {i}: logits max abs diff {diff:.2e}"
    assert not errors, f"{name}: greedy tokens differ from HF:\n" + "\n".join(errors)
    print(f"{name}: max abs logits diff {worst:.2e}")
    return worst


@pytest.mark.parametrize("kernels", ["auto", "composed"])
def test_mixed_prefill_and_decode(family, kernels):
    """With the kernels this host chose, and with the composed ones an AVX2-only host runs."""
    name, model_dir, ref = family
    engine = make_engine(model_dir, kernels=kernels)
    plan = engine.executor.plan
    assert dict(engine.executor.worker.ops.names)["rms_norm"] == (
        f"cpu_{plan.cpu_isa}" if plan.cpu_isa else "fused" if plan.kernels["fused_rms_norm"] else "composed")
    if kernels == "composed":
        assert plan.cpu_isa is None and not plan.kernels["fused_rms_norm"]
    tokens, rows = {}, {}
    n_new = ref["output_ids"].shape[1]
    for i in (0, 2):
        engine.add_request(f"p{i}", ref["prompts"][i], greedy(n_new))
    assert step(engine, tokens, rows) == {"p0", "p2"}  # two prefills
    for i in (1, 3):
        engine.add_request(f"p{i}", ref["prompts"][i], greedy(n_new))
    assert step(engine, tokens, rows) == {"p0", "p1", "p2", "p3"}  # 2 decodes + 2 prefills in one step
    drain(engine, tokens, rows)
    check(name, ref, tokens, rows)


def test_chunked_prefill(family):
    name, model_dir, ref = family
    engine = make_engine(model_dir, max_num_batched_tokens=16, max_num_seqs=4)
    tokens, rows = {}, {}
    for i, p in enumerate(ref["prompts"]):
        engine.add_request(f"p{i}", p, greedy(ref["output_ids"].shape[1]))
    drain(engine, tokens, rows)
    assert engine.num_steps >= sum(tc.PROMPT_LENGTHS) // 16 + 15  # prompts really were split
    check(name, ref, tokens, rows)


@pytest.mark.parametrize("family_name, edit, error, message", [
    ("qwen3", {"model_type": "llama"}, ValueError, "not used by model_type 'llama'.*q_norm"),
    ("llama_untied", {"attention_bias": False}, ValueError, "o_proj.bias"),
    ("qwen2", {"model_type": "qwen3"}, KeyError, "q_norm.weight"),
    ("llama_tied", {"tie_word_embeddings": False}, KeyError, "lm_head.weight"),
])
def test_config_and_weights_disagree(tmp_path, family_name, edit, error, message):
    """A config.json that does not describe its weights fails at load, naming a tensor, instead of
    running with tensors silently ignored (HF would warn and carry on)."""
    from paddle_llm_engine.config import ModelConfig
    from paddle_llm_engine.models import build_model

    d = tc.make_checkpoint(family_name, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **edit}))
    model = build_model(ModelConfig.from_dir(d))
    with pytest.raises(error, match=message):
        model.load_weights(str(d))
