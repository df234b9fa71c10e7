"""N-gram speculative decoding (backend/paddle_llm_engine/spec_decode/): the proposer against a
brute-force reference, the switch-off rule, the rejection rule's output distribution (chi-square),
the scheduler's draft scheduling and block rollback (prefix cache holds accepted tokens only), and
the engine on the tiny random Llama: greedy tokens identical with and without speculation (plain,
n > 1, preemption, chunked prefill + prefix caching, stop conditions inside the drafts) and
sampled first-token distributions unchanged (two-sample chi-square over seeds).

The tiny random model does not repeat itself, so n-gram proposals would rarely be accepted; the
engine tests that need accepted drafts therefore swap in an oracle proposer that proposes the
reference greedy continuation with one token corrupted at a varying position (full accepts,
partial accepts and immediate rejections all occur). The real n-gram proposer's acceptance on a
real model is checked in tests/model/test_spec_decode_families.py and benchmarks/spec_decode.py."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams
from paddle_llm_engine.block_manager import BlockManager, chain_hash
from paddle_llm_engine.sampler import SamplingState, draw_speculative
from paddle_llm_engine.scheduler import Scheduler
from paddle_llm_engine.sequence import Sequence
from paddle_llm_engine.spec_decode import ngram
from paddle_llm_engine.spec_decode.ngram import NgramProposer, SpecState, propose_ngram
from paddle_llm_engine.spec_decode.rejection import accept_or_resample
from paddle_llm_engine.step import build_step

BLOCK = 16
MAX_LEN = 128


# -- proposer ----------------------------------------------------------------------------------------
def _reference_propose(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Brute force: longest n first, latest earlier start first."""
    L = len(tokens)
    for n in range(n_max, n_min - 1, -1):
        if n >= L:
            continue
        suffix = tokens[L - n:]
        for i in range(L - n - 1, -1, -1):
            if tokens[i:i + n] == suffix:
                return tokens[i + n:i + n + k]
    return []


def test_propose_matches_brute_force():
    rng = np.random.default_rng(0)
    nonempty = 0
    for trial in range(2000):
        L = int(rng.integers(1, 60))
        vocab = int(rng.integers(2, 8))
        toks = rng.integers(0, vocab, size=L).tolist()
        k, n_min = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        n_max = n_min + int(rng.integers(0, 3))
        got = propose_ngram(toks, k, n_min, n_max)
        assert got == _reference_propose(toks, k, n_min, n_max), (toks, k, n_min, n_max)
        nonempty += bool(got)
    assert nonempty > 1000  # the comparison covered real proposals


def test_propose_examples():
    # last 2 tokens [7, 8] occur at 1 and 4; the latest (4) is followed by [9, 1]
    assert propose_ngram([5, 7, 8, 3, 7, 8, 9, 1, 7, 8], 3, 2, 2) == [9, 1, 7]
    assert propose_ngram([5, 7, 8, 3, 7, 8, 9, 1, 7, 8], 1, 2, 2) == [9]
    assert propose_ngram([1, 2, 3, 4], 3, 1, 3) == []            # nothing repeats
    assert propose_ngram([1, 2, 3, 9, 2, 3], 5, 2, 4) == [9, 2, 3]  # n=2 after n=4,3 fail
    assert propose_ngram([4, 4, 4], 2, 1, 2) == [4]               # overlapping match: start 0, n 2
    assert propose_ngram([1, 2, 1, 2], 0, 1, 2) == []


def _seq(tokens, max_tokens=100, n_prompt=None):
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    n_prompt = len(tokens) if n_prompt is None else n_prompt
    s = Sequence("r", tokens[:n_prompt], sp, max_tokens, [2])
    s.token_ids = list(tokens)
    return s


def test_proposer_bounds():
    toks = [5, 6, 7, 8, 9, 10, 11, 5, 6]
    prop = NgramProposer(4, 1, 3, max_model_len=100)
    s = _seq(toks)
    assert prop(s, 10) == ()  # no SpecState: the sequence does not speculate
    s.spec = SpecState()
    assert prop(s, 10) == (7, 8, 9, 10)
    assert prop(s, 2) == (7, 8)                      # step budget
    s2 = _seq(toks, max_tokens=3, n_prompt=7)        # 2 outputs, 1 left: no room for a draft + bonus
    s2.spec = SpecState()
    assert prop(s2, 10) == ()
    s3 = _seq(toks, max_tokens=6, n_prompt=7)        # 4 left: 3 drafts + bonus
    s3.spec = SpecState()
    assert prop(s3, 10) == (7, 8, 9)
    prop_len = NgramProposer(4, 1, 3, max_model_len=len(toks) + 3)  # 3 positions left: 2 drafts + bonus
    s4 = _seq(toks)
    s4.spec = SpecState()
    assert prop_len(s4, 10) == (7, 8)


def test_switch_off_backoff_and_recovery():
    st = SpecState()
    assert st.should_propose()
    st.record(4, 0)            # 0.5
    assert st.should_propose()
    st.record(4, 0)            # 0.25
    assert st.should_propose()
    st.record(4, 0)            # 0.125 < 0.2: off for 8 steps
    assert [st.should_propose() for _ in range(ngram.BACKOFF_MIN)] == [False] * ngram.BACKOFF_MIN
    assert st.should_propose()  # probe
    st.record(4, 0)            # still low: off for 16
    assert sum(st.should_propose() for _ in range(2 * ngram.BACKOFF_MIN)) == 0
    assert st.should_propose()
    st.record(4, 4)            # 0.53: back on, backoff reset
    assert st.acceptance > ngram.SWITCH_OFF_ACCEPTANCE and st.backoff == ngram.BACKOFF_MIN
    assert st.should_propose()
    st.record(0, 0)            # nothing proposed: no change
    assert st.should_propose()


# -- rejection rule ----------------------------------------------------------------------------------
@pytest.mark.parametrize("draft", [0, 3, 5])
def test_rejection_rule_keeps_the_distribution(draft):
    """Emitted tokens follow p exactly (chi-square goodness of fit), the draft is accepted with
    probability p(draft) (binomial test), and a rejection never emits the draft."""
    p = np.array([0.05, 0.1, 0.4, 0.2, 0.25, 0.0])
    rng = np.random.default_rng(1234 + draft)
    n = 40_000
    counts = np.zeros(p.size)
    accepted = 0
    for _ in range(n):
        tok, ok = accept_or_resample(p, draft, rng)
        counts[tok] += 1
        accepted += ok
        assert ok == (tok == draft) or p[draft] == 0.0
    nz = p > 0
    chi = stats.chisquare(counts[nz], n * p[nz])
    assert chi.pvalue > 1e-3, (counts, chi)
    assert counts[~nz].sum() == 0
    assert stats.binomtest(accepted, n, p[draft]).pvalue > 1e-3 if p[draft] > 0 else accepted == 0
    # a broken rule (always accept a draft with positive p) fails the same test
    if 0 < p[draft] < 1:
        bad = np.zeros(p.size)
        bad[draft] = n
        assert stats.chisquare(bad[nz] + 1e-9, n * p[nz]).pvalue < 1e-3


def test_draw_speculative_greedy_and_processing():
    """Greedy: accepted iff the draft is the argmax of the processed row (repetition penalty and
    min_tokens read the sequence's tokens so far)."""
    raw = np.array([0.0, 5.0, 4.9, 1.0, 0.5], dtype=np.float32)
    sp = SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=2.0, min_tokens=0)
    seq = Sequence("r", [3], sp, 10, [4])
    st = SamplingState.create(sp, 0, [4])
    assert draw_speculative(raw, seq, st, 1)[:2] == (1, True)
    seq.append_token(1)  # now 1 is penalised (5.0 / 2 = 2.5 < 4.9)
    assert draw_speculative(raw, seq, st, 1)[:2] == (2, False)
    assert draw_speculative(raw, seq, st, None)[:2] == (2, False)
    sp2 = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=3)
    raw2 = np.array([0.0, 1.0, 0.0, 0.0, 9.0], dtype=np.float32)  # 4 = EOS suppressed before min_tokens
    seq2 = Sequence("r", [3], sp2, 10, [4])
    st2 = SamplingState.create(sp2, 0, [4])
    assert draw_speculative(raw2, seq2, st2, 4)[:2] == (1, False)


# -- scheduler and blocks ----------------------------------------------------------------------------
def test_scheduler_drafts_blocks_and_rollback():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    drafts_to_give = {"n": (70, 71, 72, 73, 74)}
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64,
                    proposer=lambda seq, budget: drafts_to_give["n"][:budget])
    sp = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    seq = Sequence("r", list(range(10, 16)), sp, 50, [2])  # 6 prompt tokens
    sch.add(seq)
    out = sch.schedule()
    assert [(s.num_new_tokens, s.draft_token_ids) for s in out.scheduled] == [(6, ())]  # prefill: no drafts
    sch.advance(out.scheduled)
    seq.append_token(16)  # 7 tokens, 6 computed
    out = sch.schedule()
    (s,) = out.scheduled
    assert s.num_new_tokens == 6 and s.draft_token_ids == (70, 71, 72, 73, 74) and s.samples
    assert len(seq.block_table) == 3  # positions 0 .. 11
    step = build_step(out.scheduled)
    assert step.seqs[0].token_ids == (16, 70, 71, 72, 73, 74) and step.seqs[0].start == 6
    assert step.num_sampled == 6 and step.row_offsets() == [0]
    sch.advance(out.scheduled)
    assert seq.num_computed_tokens == 7  # the drafts' KV is not counted yet
    # verify: drafts 70, 71 accepted, then a correction 99
    for t in (70, 71, 99):
        seq.append_token(t)
    sch.rollback(seq, 2)
    assert seq.num_computed_tokens == 9 and seq.num_tokens == 10
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5  # 10 tokens need 3 blocks
    # prefix cache: blocks 0 and 1 full of computed tokens, with the accepted tokens only
    assert len(seq.block_hashes) == 2
    h0 = chain_hash(None, (10, 11, 12, 13))
    assert seq.block_hashes == [h0, chain_hash(h0, (14, 15, 16, 70))]
    # a second verify with every draft rejected frees the block taken for the drafts
    drafts_to_give["n"] = (80, 81, 82, 83, 84, 85, 86)
    out = sch.schedule()
    (s,) = out.scheduled
    assert s.num_new_tokens == 8 and len(seq.block_table) == 5  # positions up to 16
    sch.advance(out.scheduled)
    seq.append_token(55)
    sch.rollback(seq, 0)
    assert seq.num_computed_tokens == 10 and seq.num_tokens == 11
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    assert len(seq.block_hashes) == 2  # block 2 (positions 8..11) is not full of computed tokens
    assert all(bm._block_hash[b] is None for b in range(8) if b not in seq.block_table[:2])
    sch.finish(seq, "stop")
    assert bm.num_free_blocks == 8


def test_drafts_dropped_before_anything_is_preempted():
    bm = BlockManager(num_blocks=2, block_size=4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, proposer=lambda seq, budget: (1, 2, 3, 4, 5))
    sp = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    seq = Sequence("r", [10, 11, 12, 13, 14, 15], sp, 50, [2])
    sch.add(seq)
    sch.advance(sch.schedule().scheduled)
    seq.append_token(16)
    out = sch.schedule()  # 7 + 5 tokens would need 3 blocks: only 2 exist
    assert [(s.num_new_tokens, s.draft_token_ids) for s in out.scheduled] == [(1, ())] and not out.preempted


def test_config_validation():
    base = dict(model_dir="x")
    for kw, msg in [({"speculative_method": "eagle"}, "speculative_method"),
                    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
                    ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
                    ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max"),
                    ({"speculative_method": "ngram", "num_speculative_tokens": 40, "max_num_batched_tokens": 40,
                      "max_num_seqs": 8}, "max_num_batched_tokens")]:
        with pytest.raises(ValueError, match=msg):
            EngineConfig(**base, **kw).validate_speculative()
    c = EngineConfig(**base, speculative_method=" NGRAM ")
    c.validate_speculative()
    assert c.speculative and c.speculative_method == "ngram"
    assert not EngineConfig(**base).speculative


# -- engine on the tiny Llama ------------------------------------------------------------------------
def make_engine(model_dir: str, **kw) -> LLMEngine:
    cfg = dict(model_dir=model_dir, device="cpu", block_size=BLOCK, num_kv_blocks=64, max_model_len=MAX_LEN,
               max_num_seqs=8, max_num_batched_tokens=512, num_threads=2)
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


def prompt(n: int, salt: int = 0) -> list[int]:
    rng = np.random.default_rng(1000 + salt)
    return rng.integers(100, 40000, size=n).tolist()


def run(engine: LLMEngine, requests: dict, max_steps: int = 10_000, expect_free: bool = True):
    """{(rid, seq index): {"tokens", "reason", "logprobs"}} after stepping to completion."""
    res = {}
    for rid, (ids, sp) in requests.items():
        engine.add_request(rid, ids, sp)
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            r = res.setdefault((out.request_id, out.sequence_index), {"tokens": [], "reason": None, "logprobs": [],
                                                                     "text": ""})
            r["tokens"] += out.token_ids
            r["logprobs"] += out.logprobs
            r["text"] += out.text
            assert len(out.logprobs) == len(out.token_ids)
            if out.sequence_finished:
                r["reason"] = out.finish_reason
    assert not engine.has_unfinished_requests()
    if expect_free:
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "KV blocks leaked"
    return res


class OracleProposer:
    """Proposes the reference continuation of each (request, sequence) with the draft at position
    (call count mod (k + 2)) replaced by a wrong token (no corruption when that is >= k)."""

    def __init__(self, refs: dict, k: int, max_model_len: int = MAX_LEN):
        self.refs, self.k, self.max_model_len, self.calls = refs, k, max_model_len, 0

    def __call__(self, seq, budget):
        ref = self.refs.get((seq.request_id, seq.seq_index))
        if ref is None:
            return ()
        self.calls += 1
        n_out = seq.num_output_tokens
        k = min(self.k, budget, seq.max_tokens - n_out - 1, self.max_model_len - seq.num_tokens - 1)
        d = list(ref[n_out:n_out + max(k, 0)])
        bad = self.calls % (self.k + 2)
        if bad < len(d):
            d[bad] = 100 + (d[bad] + 1) % 30000
        return tuple(d)


def spec_engine(model_dir, refs, k=4, **kw):
    e = make_engine(model_dir, speculative_method="ngram", num_speculative_tokens=k, **kw)
    e.scheduler.proposer = OracleProposer(refs, k, e.config.max_model_len)
    return e


def greedy(max_tokens, **kw):
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens, **kw)


@pytest.fixture(scope="module")
def plain_engine(tiny_model_dir):
    return make_engine(tiny_model_dir)


def _requests():
    return {"a": (prompt(5, 1), greedy(40, logprobs=2)), "b": (prompt(33, 2), greedy(25)),
            "c": (prompt(17, 3), greedy(9)), "d": (prompt(70, 4), greedy(50))}


def test_greedy_identical_with_oracle_drafts(tiny_model_dir, plain_engine):
    want = run(plain_engine, _requests())
    refs = {k: v["tokens"] for k, v in want.items()}
    e = spec_engine(tiny_model_dir, refs)
    got = run(e, _requests())
    assert {k: v["tokens"] for k, v in got.items()} == refs
    assert {k: v["reason"] for k, v in got.items()} == {k: "length" for k in refs}
    # logprobs of every token come from its own row: equal to the plain run's
    np.testing.assert_allclose([lp for lp, _ in got[("a", 0)]["logprobs"]],
                               [lp for lp, _ in want[("a", 0)]["logprobs"]], atol=1e-4)
    assert [[t for t, _ in top] for _, top in got[("a", 0)]["logprobs"]] == \
        [[t for t, _ in top] for _, top in want[("a", 0)]["logprobs"]]
    s = e.stats()
    assert s.spec_num_drafts > 0 and 0 < s.spec_num_accepted_tokens < s.spec_num_draft_tokens
    assert s.spec_accepted_per_pos[0] >= s.spec_accepted_per_pos[-1] > 0
    assert sum(s.spec_accepted_per_pos) == s.spec_num_accepted_tokens
    assert e.num_steps < plain_engine.num_steps  # fewer steps: several tokens per step


def test_greedy_identical_with_ngram_proposer(tiny_model_dir, plain_engine):
    """The real proposer (whatever it proposes on a random model: greedy tokens cannot change)."""
    p = prompt(12, 7)
    out = run(plain_engine, {"o": (p, greedy(20))})[("o", 0)]["tokens"]
    # the prompt repeats its start after the model's own continuation of it: the last tokens match
    # the earlier occurrence, whose continuation is proposed
    reqs = {"r": (p + out + p, greedy(40)), "s": (prompt(40, 8), greedy(30))}
    want = run(plain_engine, reqs)
    e = make_engine(tiny_model_dir, speculative_method="ngram", prompt_lookup_min=1)
    got = run(e, reqs)
    assert {k: v["tokens"] for k, v in got.items()} == {k: v["tokens"] for k, v in want.items()}
    assert e.stats().spec_num_draft_tokens > 0  # the prompt's repeats gave proposals


def test_stops_inside_the_drafts(tiny_model_dir, plain_engine):
    """A stop token / stop string reached inside accepted drafts ends the sequence right there."""
    ref = run(plain_engine, {"a": (prompt(9, 11), greedy(30))})[("a", 0)]["tokens"]
    stop_tok = ref[6]
    first = ref.index(stop_tok)
    reqs = {"a": (prompt(9, 11), SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[stop_tok]))}
    want = run(plain_engine, reqs)
    e = spec_engine(tiny_model_dir, {("a", 0): ref}, k=8)
    e.scheduler.proposer.calls = 9  # no corruption on the first proposal: the stop is an accepted draft
    got = run(e, reqs)
    assert got[("a", 0)]["tokens"] == want[("a", 0)]["tokens"] == ref[:first + 1]
    assert got[("a", 0)]["reason"] == "stop"


def test_n_greater_than_one_and_preemption(tiny_model_dir):
    """n = 2 greedy siblings (forked, sharing the prompt's blocks) and a KV cache so small that
    sequences are preempted and recomputed: tokens equal the plain run's."""
    reqs = {"n2": (prompt(20, 21), greedy(40, n=2)), "x": (prompt(30, 22), greedy(60)),
            "y": (prompt(25, 23), greedy(60))}
    plain = make_engine(tiny_model_dir, num_kv_blocks=10)
    want = run(plain, reqs)
    assert plain.scheduler.num_preemptions > 0
    refs = {k: v["tokens"] for k, v in want.items()}
    e = spec_engine(tiny_model_dir, refs, num_kv_blocks=10)
    got = run(e, reqs)
    assert e.scheduler.num_preemptions > 0
    assert {k: v["tokens"] for k, v in got.items()} == refs
    assert got[("n2", 0)]["tokens"] == got[("n2", 1)]["tokens"]
    assert e.stats().spec_num_accepted_tokens > 0


def test_chunked_prefill_and_prefix_caching(tiny_model_dir):
    """Shared 48-token prefix, prompts chunked at 24 tokens per step, sequences decoding with drafts
    next to other sequences' chunks; the later requests find the earlier ones' blocks in the prefix
    cache (which must hold only verified tokens: equal outputs prove it)."""
    shared = prompt(48, 31)
    reqs = {f"p{i}": (shared + prompt(5 + 7 * i, 40 + i), greedy(30)) for i in range(4)}
    kw = dict(max_num_batched_tokens=24, prefill_chunk_size=24, enable_prefix_caching=1, max_num_seqs=4)
    plain = make_engine(tiny_model_dir, **kw)
    want = run(plain, reqs)
    refs = {k: v["tokens"] for k, v in want.items()}
    e = spec_engine(tiny_model_dir, refs, **kw)
    got = run(e, dict(list(reqs.items())[:2]))
    got.update(run(e, dict(list(reqs.items())[2:])))  # second wave: prefix-cache hits on decoded blocks too
    assert {k: v["tokens"] for k, v in got.items()} == refs
    assert e.block_manager.prefix_hit_tokens > 0 and e.stats().spec_num_accepted_tokens > 0
    # a prompt that is a finished sequence's prompt + output hits its output blocks: same continuation
    cont = reqs["p0"][0] + refs[("p0", 0)]
    w2 = run(plain, {"q": (cont, greedy(10))})
    hits = e.block_manager.prefix_hit_tokens
    g2 = run(e, {"q": (cont, greedy(10))})
    assert e.block_manager.prefix_hit_tokens - hits >= 64
    assert g2[("q", 0)]["tokens"] == w2[("q", 0)]["tokens"]


@pytest.mark.slow
def test_sampled_distribution_unchanged(tiny_model_dir):
    """temperature 2 and top_k 6 (a spread distribution over few tokens), 3 tokens per request, 400 seeds with
    and without speculation. The drafts come from a deterministic proposer built from the plain
    run (after first token t1: the most frequent second token after t1, then the most frequent
    third token after those two), so they are accepted with probability p(draft) and otherwise
    resampled. The 2nd and 3rd tokens' frequencies (tokens seen >= 10 times, the rest pooled) must
    agree between the runs (two-sample chi-square), and the speculative run must have accepted and
    rejected drafts."""
    from collections import Counter

    n_req = 400
    p0 = prompt(6, 51)
    sp = [SamplingParams(temperature=2.0, top_k=6, max_tokens=3, ignore_eos=True, seed=s) for s in range(n_req)]
    kw = dict(max_num_seqs=64, num_kv_blocks=256, max_num_waiting=1000)
    plain = make_engine(tiny_model_dir, **kw)
    want = run(plain, {f"r{s}": (p0, sp[s]) for s in range(n_req)})
    outs = [want[(f"r{i}", 0)]["tokens"] for i in range(n_req)]
    mode2 = {t1: Counter(o[1] for o in outs if o[0] == t1).most_common(1)[0][0] for t1 in {o[0] for o in outs}}
    pairs = {(o[0], o[1]) for o in outs}
    mode3 = {pr: Counter(o[2] for o in outs if (o[0], o[1]) == pr).most_common(1)[0][0] for pr in pairs}

    def proposer(seq, budget):
        out = seq.output_token_ids
        if len(out) != 1:
            return ()
        d2 = mode2.get(out[0])
        if d2 is None:
            return ()
        d3 = mode3.get((out[0], d2))
        return (d2,) if d3 is None else (d2, d3)

    e = make_engine(tiny_model_dir, speculative_method="ngram", **kw)
    e.scheduler.proposer = proposer
    got = run(e, {f"r{s}": (p0, sp[s]) for s in range(n_req)})
    s = e.stats()
    assert 0 < s.spec_num_accepted_tokens < s.spec_num_draft_tokens
    assert s.spec_accepted_per_pos[1] > 0
    for pos in (0, 1, 2):
        a = np.array([o[pos] for o in outs])
        b = np.array([got[(f"r{i}", 0)]["tokens"][pos] for i in range(n_req)])
        vals, counts = np.unique(np.concatenate([a, b]), return_counts=True)
        common = vals[counts >= 10]
        assert len(common) >= 3, "the test needs a spread distribution"
        table = np.array([[np.sum(a == v) for v in common] + [np.sum(~np.isin(a, common))],
                          [np.sum(b == v) for v in common] + [np.sum(~np.isin(b, common))]])
        table = table[:, table.sum(0) > 0]
        pval = stats.chi2_contingency(table).pvalue
        print(f"position {pos}: {table.shape[1]} classes, p-value {pval:.3f}")
        assert pval > 1e-3, (pos, table, pval)
    # the first token is drawn exactly as without speculation (same seed, no draft): identical
    assert [got[(f"r{i}", 0)]["tokens"][0] for i in range(n_req)] == [o[0] for o in outs]


def test_config_pbtxt_parameters():
    """The settings flow from config.pbtxt parameters like every EngineConfig field."""
    from paddle_llm_triton.config_params import engine_config_from_triton

    def triton(params):
        return {"name": "llm", "parameters": {k: {"string_value": v} for k, v in params.items()}}

    args = {"model_name": "llm", "model_instance_name": "llm_0_0"}
    cfg = engine_config_from_triton(triton({"model_dir": "/m", "speculative_method": "ngram",
                                            "num_speculative_tokens": "6", "prompt_lookup_min": "1",
                                            "prompt_lookup_max": "5"}), args)
    assert (cfg.speculative_method, cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (
        "ngram", 6, 1, 5)
    cfg = engine_config_from_triton(triton({"model_dir": "/m"}), args)
    assert (cfg.speculative_method, cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (
        "none", 4, 2, 4)
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer"):
        engine_config_from_triton(triton({"model_dir": "/m", "num_speculative_tokens": "four"}), args)


def test_guided_requests_speculate_with_the_guides_masks(tiny_model_dir, plain_engine):
    """Regex and JSON-schema guided requests (greedy and seeded sampling): with oracle drafts (the
    plain run's tokens, one corrupted per proposal) the greedy tokens are the plain run's and obey
    the guide; drafts were accepted and rejected; the real n-gram proposer on a repetitive regex
    gives the same tokens too; sampled guided outputs still match their guide."""
    import json
    import re

    from paddle_llm_engine.guided import GuideSpec

    regex = r"(ab-[0-9]{2} ){6}"
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "tags": {"type": "array", "items": {"enum": ["x", "y"]},
                                                        "maxItems": 6}},
              "required": ["name", "tags"]}
    reqs = {"re": (prompt(10, 61), SamplingParams(temperature=0.0, max_tokens=60, guide=GuideSpec("regex", regex))),
            "js": (prompt(12, 62), SamplingParams(temperature=0.0, max_tokens=80, guide=GuideSpec(
                "json_schema", json.dumps(schema), whitespace_flexible=False)))}
    want = run(plain_engine, reqs)
    assert re.fullmatch(regex, want[("re", 0)]["text"]) and want[("re", 0)]["reason"] == "stop"
    refs = {k: v["tokens"] for k, v in want.items()}
    e = spec_engine(tiny_model_dir, refs)
    got = run(e, reqs)
    assert {k: v["tokens"] for k, v in got.items()} == refs
    assert {k: v["text"] for k, v in got.items()} == {k: v["text"] for k, v in want.items()}
    st = e.stats()
    assert 0 < st.spec_num_accepted_tokens < st.spec_num_draft_tokens
    ng = make_engine(tiny_model_dir, speculative_method="ngram", prompt_lookup_min=1)
    got2 = run(ng, {"re": reqs["re"]})
    assert got2[("re", 0)]["tokens"] == refs[("re", 0)]
    assert ng.stats().spec_num_accepted_tokens > 0  # the repeated pattern's tokens were drafted
    sampled = {f"s{i}": (prompt(10, 70 + i), SamplingParams(temperature=1.0, seed=i, max_tokens=60,
                                                            guide=GuideSpec("regex", regex))) for i in range(4)}
    for k, v in run(ng, sampled).items():
        assert v["reason"] == "stop" and re.fullmatch(regex, v["text"]), (k, v["text"])
