"""Speculative decoding on every model family's tiny checkpoint (tests/support/tiny_checkpoints.py):
the greedy tokens with speculation equal HF transformers' recorded ones (the fixtures of
test_model_families.py), with the real n-gram proposer (prompt_lookup_min 1: the 512-token vocabulary
makes matches common) and with an oracle proposer (HF's continuation with one token corrupted at a
varying position, so drafts are accepted, partly accepted and rejected in every run); and a
tensor-parallel (TP=2) run equal to HF's too."""

from __future__ import annotations

import pytest

from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams

import tiny_checkpoints as tc
from test_model_families import load_fixture

K = 4


class Oracle:
    def __init__(self, refs: dict, k: int):
        self.refs, self.k, self.calls = refs, k, 0

    def __call__(self, seq, budget):
        self.calls += 1
        ref = self.refs[seq.request_id]
        n = seq.num_output_tokens
        d = list(ref[n:n + max(0, min(self.k, budget, seq.max_tokens - n - 1))])
        bad = self.calls % (self.k + 2)
        if bad < len(d):
            d[bad] = 3 + (d[bad] + 1) % (tc.VOCAB - 3)
        return tuple(d)


def _engine(model_dir, **kw):
    cfg = dict(model_dir=str(model_dir), device="cpu", block_size=16, num_kv_blocks=48, max_model_len=128,
               max_num_seqs=8, max_num_batched_tokens=256, num_threads=1, speculative_method="ngram",
               num_speculative_tokens=K, prompt_lookup_min=1, prompt_lookup_max=3)
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


def _run(engine, prompts, n_new):
    try:
        for i, p in enumerate(prompts):
            engine.add_request(f"p{i}", p, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n_new))
        tokens = {}
        for _ in range(500):
            if not engine.has_unfinished_requests():
                break
            for out in engine.step():
                tokens.setdefault(out.request_id, []).extend(out.token_ids)
        assert not engine.has_unfinished_requests()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "KV blocks leaked"
        return tokens, engine.stats()
    finally:
        engine.close()


@pytest.fixture(scope="module", params=sorted(tc.FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    ref = load_fixture(name)
    model_dir = tc.make_checkpoint(name, tmp_path_factory.mktemp(f"spec_{name}"))
    assert tc.tensors_sha256(model_dir) == ref["meta"]["tensors_sha256"]
    return name, model_dir, ref


def _want(ref):
    return {f"p{i}": ref["output_ids"][i].tolist() for i in range(len(ref["prompts"]))}


def test_ngram_greedy_equals_hf(family):
    name, model_dir, ref = family
    got, st = _run(_engine(model_dir), ref["prompts"], ref["output_ids"].shape[1])
    assert got == _want(ref), name
    assert st.spec_num_draft_tokens > 0, f"{name}: the n-gram proposer proposed nothing"
    print(f"{name}: {st.spec_num_accepted_tokens} / {st.spec_num_draft_tokens} drafts accepted")


def test_oracle_drafts_greedy_equals_hf(family):
    name, model_dir, ref = family
    e = _engine(model_dir)
    e.scheduler.proposer = Oracle(_want(ref), K)
    got, st = _run(e, ref["prompts"], ref["output_ids"].shape[1])
    assert got == _want(ref), name
    assert 0 < st.spec_num_accepted_tokens < st.spec_num_draft_tokens


def test_tensor_parallel_greedy_equals_hf(tmp_path):
    ref = load_fixture("llama_untied")
    model_dir = tc.make_checkpoint("llama_untied", tmp_path / "llama_untied")
    got, st = _run(_engine(model_dir, tensor_parallel_size=2), ref["prompts"], ref["output_ids"].shape[1])
    assert got == _want(ref)
    assert st.spec_num_draft_tokens > 0
