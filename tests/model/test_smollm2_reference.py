"""The engine on SmolLM2-135M-Instruct against HF transformers (torch CPU, fp32) greedy references.

Fixture: tests/reference/fixtures/smollm2_greedy.npz (+ .json metadata), made by
tests/reference/make_hf_reference.py in the reference venv: 8 prompts of 5 to 294 tokens (plain
and chat-templated, one CJK, one with emoji), 24 greedy tokens each, EOS not honoured. The engine is
fed exactly the recorded prompt ids, so tokenizer differences cannot matter.

Checked for every prompt and every one of the 24 positions:
- the greedy token equals HF's (all 8 x 24);
- the logits of the 20 ids HF ranked highest, and the row's logsumexp, agree within LOGIT_ATOL;
- at output positions 0 (the prefill row), 8 and 23, the full 49152-wide row agrees within
  LOGIT_ATOL (max abs diff).

Measured on the 2-core dev machine (paddle 3.3.1 CPU vs torch 2.13.0 CPU, eager attention), logits
being O(10-30): max abs diff of the full rows 6.9e-5 with mixed prefill/decode steps, 7.9e-5 with
chunked prefill, 7.5e-5 with all 8 prompts prefilled in one step; top-20 values and logsumexp over
all 24 positions at most 5.5e-5.
LOGIT_ATOL = 1e-3 leaves >10x margin for other CPUs / BLAS paths while still catching any real
error (a wrong position, mask or KV slot moves logits by O(0.1-10)). The smallest top-1/top-2 gap
in the reference is 0.012, so greedy tokens are stable under that tolerance.

Scheduling is part of the test: the first test submits 4 prompts, runs one step (4 prefills), then
submits the other 4, so the next step mixes 4 decodes with 4 prefills; the second uses a 64-token
step budget so long prompts are chunked (and chunks share steps with decodes); the third checks
batch invariance (8 concurrent requests give exactly the tokens each gives alone).

The model folder is prepared by setup; a missing folder fails (see conftest.py), never skips.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams
from paddle_llm_engine.platforms import host_cpu

FIXTURE = Path(__file__).resolve().parents[1] / "reference" / "fixtures" / "smollm2_greedy.npz"
LOGIT_ATOL = 1e-3
BLOCK = 16
MAX_LEN = 512


@pytest.fixture(scope="module")
def ref():
    if not FIXTURE.is_file():
        pytest.fail(f"{FIXTURE} missing: run tests/reference/make_hf_reference.py with the reference venv",
                    pytrace=False)
    d = dict(np.load(FIXTURE))
    d["meta"] = json.loads(FIXTURE.with_suffix(".json").read_text())
    d["prompts"] = [d["prompt_ids"][i, :n].tolist() for i, n in enumerate(d["prompt_lens"])]
    return d


def make_engine(model_dir: str, **kw) -> LLMEngine:
    # prefill_chunk_size 0: the mixed-step test puts four whole prompts (456 tokens) beside four decodes
    cfg = dict(model_dir=model_dir, device="cpu", block_size=BLOCK, num_kv_blocks=96, max_model_len=MAX_LEN,
               max_num_seqs=16, max_num_batched_tokens=2048, prefill_chunk_size=0, num_threads=2,
               kv_cache_dtype="float32")  # the model path against HF in fp32; 16-bit KV: test_kv_cache_16bit.py
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


@pytest.fixture(scope="module")
def shared_engine(smollm2_dir):
    return make_engine(smollm2_dir)


@pytest.fixture
def engine(shared_engine):
    """The module's engine, emptied after each test so one failure does not cascade."""
    yield shared_engine
    for rid in list(shared_engine.requests):
        shared_engine.abort_request(rid)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n)


class Collector:
    """Accumulates step outputs per request: tokens and the logits row behind each token."""

    def __init__(self):
        self.tokens: dict[str, list[int]] = {}
        self.logits: dict[str, list[np.ndarray]] = {}
        self.finished: set[str] = set()

    def step(self, engine: LLMEngine, return_logits: bool = True) -> set[str]:
        outs = engine.step(return_logits=return_logits)
        for o in outs:
            assert len(o.token_ids) == 1, "one step samples at most one token per request"
            self.tokens.setdefault(o.request_id, []).extend(o.token_ids)
            if return_logits:
                self.logits.setdefault(o.request_id, []).append(o.logits)
            if o.finished:
                self.finished.add(o.request_id)
        return {o.request_id for o in outs}

    def drain(self, engine: LLMEngine, return_logits: bool = True, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not engine.has_unfinished_requests():
                break
            self.step(engine, return_logits)
        assert not engine.has_unfinished_requests()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "KV blocks leaked"


def check_against_reference(ref, col: Collector) -> float:
    """Assert tokens and logits; return the max abs diff over the stored full rows."""
    n_new = ref["output_ids"].shape[1]
    token_errors = []
    worst_full = worst_top = 0.0
    for i in range(len(ref["prompts"])):
        rid = f"p{i}"
        want = ref["output_ids"][i].tolist()
        got = col.tokens.get(rid, [])
        if got != want:
            k = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            token_errors.append(f"prompt {i} ({ref['prompt_lens'][i]} tokens): first mismatch at output {k}: "
                                f"got {got[k:k + 4]}, HF {want[k:k + 4]}")
            continue
        rows = col.logits[rid]
        assert len(rows) == n_new
        for k in range(n_new):
            row = rows[k].astype(np.float64)
            top_diff = np.abs(row[ref["top_ids"][i, k]] - ref["top_vals"][i, k]).max()
            assert top_diff < LOGIT_ATOL, f"prompt {i} output {k}: top-20 logits differ by {top_diff:.2e}"
            m = row.max()
            lse_diff = abs(m + np.log(np.exp(row - m).sum()) - ref["logsumexp"][i, k])
            assert lse_diff < LOGIT_ATOL, f"prompt {i} output {k}: logsumexp differs by {lse_diff:.2e}"
            worst_top = max(worst_top, top_diff, lse_diff)
        for j, k in enumerate(ref["full_positions"]):
            diff = float(np.abs(rows[k] - ref["full_logits"][i, j]).max())
            worst_full = max(worst_full, diff)
            assert diff < LOGIT_ATOL, f"prompt {i} output {k}: full logits row max abs diff {diff:.2e}"
    assert not token_errors, "greedy tokens differ from HF:\n" + "\n".join(token_errors)
    print(f"max abs logits diff: full rows {worst_full:.2e}, top-20 / logsumexp at all positions {worst_top:.2e}")
    return worst_full


def test_fixture_matches_model(ref, smollm2_dir):
    """The fixture belongs to this exact model file and tokenizer: a changed conversion needs a new
    fixture (run tests/reference/make_hf_reference.py), which this test says instead of letting the
    comparisons below fail obscurely."""
    import hashlib

    from paddle_llm_engine.tokenizer import load_tokenizer

    h = hashlib.sha256()
    with open(Path(smollm2_dir) / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    assert h.hexdigest() == ref["meta"]["model_safetensors_sha256"], (
        "model.safetensors differs from the one the HF reference was made from: regenerate the fixture with "
        "`<ref-venv>/bin/python tests/reference/make_hf_reference.py`")
    tok = load_tokenizer(smollm2_dir)
    for i, p in enumerate(ref["meta"]["prompts"]):
        text = p["text"]
        if p["kind"] == "chat":
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        assert tok.encode(text, add_special_tokens=False) == ref["prompts"][i], f"prompt {i} tokenizes differently"
    assert len(ref["prompts"]) >= 8 and min(ref["prompt_lens"]) <= 8 and max(ref["prompt_lens"]) >= 250


def test_greedy_matches_hf_with_mixed_prefill_and_decode(ref, engine):
    first, second = [0, 2, 4, 6], [1, 3, 5, 7]
    col = Collector()
    for i in first:
        engine.add_request(f"p{i}", ref["prompts"][i], greedy(24))
    assert col.step(engine) == {f"p{i}" for i in first}  # 4 prefills, each sampled its first token
    for i in second:
        engine.add_request(f"p{i}", ref["prompts"][i], greedy(24))
    # One step: decodes of the first 4 and whole-prompt prefills of the other 4.
    assert col.step(engine) == {f"p{i}" for i in first + second}
    assert all(len(col.tokens[f"p{i}"]) == 2 for i in first)
    assert all(len(col.tokens[f"p{i}"]) == 1 for i in second)
    col.drain(engine)
    assert col.finished == {f"p{i}" for i in range(8)}
    check_against_reference(ref, col)


# "auto": what this host chose (the C++ CPU kernels where built); "composed": Paddle's plain ops, the
# fallback of every host; "fused_rms_norm": Paddle's fused RMSNorm alone, only where the CPU can run it.
KERNEL_SETTINGS = ["auto", "composed"] + (["fused_rms_norm"] if host_cpu().has("avx512f") else [])


@pytest.mark.parametrize("kernels", KERNEL_SETTINGS)
def test_greedy_matches_hf_with_chunked_prefill(ref, smollm2_dir, kernels):
    eng = make_engine(smollm2_dir, max_num_batched_tokens=64, max_num_seqs=8, kernels=kernels)
    names = dict(eng.executor.worker.ops.names)
    if kernels == "composed":
        assert names["rms_norm"] == "composed" and names["linear"] == "composed"
    elif kernels == "fused_rms_norm":
        assert names["rms_norm"] == "fused" and names["linear"] == "composed"
    elif eng.executor.plan.cpu_isa:
        assert names["linear"] == f"cpu_gemv_{eng.executor.plan.cpu_isa}"
    col = Collector()
    for i, p in enumerate(ref["prompts"]):
        eng.add_request(f"p{i}", p, greedy(24))
    col.drain(eng)
    total_prompt = int(ref["prompt_lens"].sum())
    assert eng.num_steps >= total_prompt // 64 + 23  # the prompts really were split into chunks
    check_against_reference(ref, col)


def test_batch_invariance(ref, engine):
    """8 concurrent greedy requests (different lengths and max_tokens, so the batch changes as they
    finish) give exactly the tokens each gives alone."""
    n_tokens = [16 + 2 * i for i in range(8)]
    alone = {}
    for i, p in enumerate(ref["prompts"]):
        col = Collector()
        engine.add_request(f"p{i}", p, greedy(n_tokens[i]))
        col.drain(engine, return_logits=False)
        alone[f"p{i}"] = col.tokens[f"p{i}"]
    col = Collector()
    for i, p in enumerate(ref["prompts"]):
        engine.add_request(f"p{i}", p, greedy(n_tokens[i]))
    col.drain(engine, return_logits=False)
    assert col.tokens == alone
    n_ref = ref["output_ids"].shape[1]
    for i in range(8):  # and alone = HF on the tokens the reference has
        assert alone[f"p{i}"][:n_ref] == ref["output_ids"][i, :n_tokens[i]].tolist()
