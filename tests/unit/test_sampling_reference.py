"""The sampler against an independent numpy reference (sampling_reference.py: nothing imported from
the sampler's helpers): repetition penalty (HF / CTRL rule over prompt + output), presence / frequency
penalties (OpenAI rule over output tokens), min_p, top-k + top-p combined, bad words (single- and
multi-token), logprobs of the raw distribution, stop ids / min_tokens / ignore_eos.

Penalties are checked exactly through greedy choices over many random rows (the penalty must
change the argmax in a good share of them, so the check is not vacuous); filters are checked by
their support (tokens that may never be drawn) and by a chi-square test of seeded draws against the
reference distribution (alpha 0.001; deterministic, since every draw is seeded).
"""

from __future__ import annotations

import numpy as np
import pytest

from paddle_llm_engine.sampling_params import SamplingParams
from sampling_reference import (EOS, chi2_ok, draw, greedy_trials, make_seq, ref_bad_words, ref_distribution,
                                ref_log_softmax, ref_presence_frequency, ref_repetition, sample)


# ---- penalties -------------------------------------------------------------------------------------
def test_repetition_penalty_hf_rule_on_prompt_and_output():
    def params(rng):
        return SamplingParams(temperature=0.0, repetition_penalty=float(rng.choice([0.5, 1.2, 1.7, 3.0])))

    def ref(row, prompt, output, p):
        return ref_repetition(row, prompt + output, p.repetition_penalty)

    assert greedy_trials(400, 24, params, ref, seed=1) > 0.15


def test_repetition_penalty_hand_values():
    # token 3 seen in the prompt with a positive logit: divided; token 4 seen in the output with a
    # negative logit: multiplied; token 5 unseen: untouched.
    row = np.full(8, -10.0, dtype=np.float32)
    row[3], row[4], row[5] = 6.0, -1.0, 2.5
    seq = make_seq(SamplingParams(temperature=0.0, repetition_penalty=3.0), prompt=[3, 3, 7], output=[4])
    assert int(sample(row[None].copy(), [seq])[0]) == 5   # 6 / 3 = 2 < 2.5
    row[5] = 1.5
    assert int(sample(row[None].copy(), [seq])[0]) == 3   # 2 > 1.5
    row[3] = -9.0  # now 4 (-1 * 3 = -3) beats 3 (-27) but not 5 (1.5)
    assert int(sample(row[None].copy(), [seq])[0]) == 5


def test_presence_frequency_openai_rule_on_output_only():
    def params(rng):
        return SamplingParams(temperature=0.0, presence_penalty=float(rng.uniform(-2, 2)),
                              frequency_penalty=float(rng.uniform(-2, 2)))

    def ref(row, prompt, output, p):
        return ref_presence_frequency(row, output, p.presence_penalty, p.frequency_penalty)

    assert greedy_trials(400, 24, params, ref, seed=2) > 0.15


def test_presence_frequency_ignore_prompt_tokens():
    row = np.zeros(10, dtype=np.float32)
    row[3], row[4] = 5.0, 4.0
    # 3 appears many times in the prompt only: not penalized.
    seq = make_seq(SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=2.0), [3, 3, 3, 3], [])
    assert int(sample(row[None].copy(), [seq])[0]) == 3
    # once in the output: 5 - 2 - 2 = 1 < 4
    seq = make_seq(SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=2.0), [3, 3], [3])
    assert int(sample(row[None].copy(), [seq])[0]) == 4
    # frequency scales with the count: 4 in the output twice with frequency 0.3, presence 0:
    # 4 - 0.6 = 3.4 < 3.5 (token 5)
    row[5] = 3.5
    seq = make_seq(SamplingParams(temperature=0.0, frequency_penalty=0.3), [1], [4, 4])
    row[3] = 0.0
    assert int(sample(row[None].copy(), [seq])[0]) == 5
    seq = make_seq(SamplingParams(temperature=0.0, frequency_penalty=0.3), [1], [4])
    assert int(sample(row[None].copy(), [seq])[0]) == 4  # 3.7 > 3.5


def test_all_penalties_together_in_vllm_order():
    """Repetition first, then frequency and presence (vLLM's apply_penalties order)."""
    def params(rng):
        return SamplingParams(temperature=0.0, repetition_penalty=float(rng.choice([0.7, 1.5, 2.5])),
                              presence_penalty=float(rng.uniform(-1, 1)), frequency_penalty=float(rng.uniform(-1, 1)))

    def ref(row, prompt, output, p):
        x = ref_repetition(row, prompt + output, p.repetition_penalty)
        return ref_presence_frequency(x, output, p.presence_penalty, p.frequency_penalty)

    assert greedy_trials(300, 24, params, ref, seed=3) > 0.15


def test_penalised_distribution_when_sampling():
    """Penalties shape the sampled distribution too, not only greedy picks."""
    row = np.array([1.0, 0.5, 0.8, -0.3, 0.2, -1.0], dtype=np.float32)
    prompt, output = [0, 3], [2, 2, 4]
    params = SamplingParams(temperature=0.9, seed=11, repetition_penalty=1.6, presence_penalty=0.4,
                            frequency_penalty=0.3)
    seq = make_seq(params, prompt, output)
    draws = sample(np.repeat(row[None], 4000, axis=0), [seq] * 4000)
    x = ref_presence_frequency(ref_repetition(row, prompt + output, 1.6), output, 0.4, 0.3)
    p = ref_distribution(x, temperature=0.9)
    assert chi2_ok(np.bincount(draws, minlength=row.size), p)


# ---- filters ---------------------------------------------------------------------------------------
def test_min_p_support_and_distribution():
    probs = np.array([0.40, 0.25, 0.15, 0.08, 0.05, 0.04, 0.03])
    row = np.log(probs).astype(np.float32)
    for min_p, temperature in ((0.1, 1.0), (0.3, 1.0), (0.2, 0.7), (0.05, 1.5)):
        ref = ref_distribution(row, temperature=temperature, min_p=min_p)
        draws = draw(SamplingParams(temperature=temperature, min_p=min_p, seed=7), row, 3000)
        counts = np.bincount(draws, minlength=row.size)
        assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(ref)), (min_p, temperature)
        assert chi2_ok(counts, ref), (min_p, temperature, counts, ref)


def test_top_k_then_top_p_order():
    """top-p acts on the top-k renormalized distribution: probs .3 .25 .2 .15 .1 with k=3 become
    .4 .33 .27, and p=0.7 then keeps two tokens (top-p first would keep three)."""
    row = np.log(np.array([0.3, 0.25, 0.2, 0.15, 0.1])).astype(np.float32)
    ref = ref_distribution(row, top_k=3, top_p=0.7)
    assert np.flatnonzero(ref).tolist() == [0, 1]
    counts = np.bincount(draw(SamplingParams(top_k=3, top_p=0.7, seed=3), row, 2000), minlength=5)
    assert counts[2:].sum() == 0
    assert chi2_ok(counts, ref)


@pytest.mark.parametrize("case", range(8))
def test_top_k_top_p_min_p_random_rows(case):
    rng = np.random.default_rng(100 + case)
    vocab = 30
    row = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    kw = dict(temperature=float(rng.choice([0.5, 1.0, 1.3])), top_k=int(rng.choice([0, 3, 8, 15])),
              top_p=float(rng.choice([1.0, 0.5, 0.8, 0.95])), min_p=float(rng.choice([0.0, 0.0, 0.05, 0.2])))
    ref = ref_distribution(row, **kw)
    draws = draw(SamplingParams(seed=case, **kw), row, 3000)
    counts = np.bincount(draws, minlength=vocab)
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(ref)), kw
    assert chi2_ok(counts, ref), (kw, counts, np.round(ref * 3000, 1))


# ---- bad words -------------------------------------------------------------------------------------
def test_bad_words_single_and_multi_token():
    words = [[7], [3, 5], [1, 2, 4]]

    def params(rng):
        return SamplingParams(temperature=0.0, bad_words_ids=[list(w) for w in words])

    def ref(row, prompt, output, p):
        return ref_bad_words(row, prompt + output, words)

    rng_rows = np.random.default_rng(5)
    for trial in range(300):
        row = (rng_rows.standard_normal(9) * 2).astype(np.float32)
        row[[7, 5, 4]] += 3.0  # make the banned tokens likely winners
        hist = rng_rows.integers(0, 9, size=6).tolist()
        if trial % 3 == 0:
            hist[-1] = 3
        elif trial % 3 == 1:
            hist[-2:] = [1, 2]
        seq = make_seq(params(None), hist[:2], hist[2:], eos=())
        expect = int(np.argmax(ref(row, hist[:2], hist[2:], None)))
        got = int(sample(row[None].copy(), [seq])[0])
        assert got == expect, (hist, row)
        assert got != 7
        if hist[-1] == 3:
            assert got != 5
        if hist[-2:] == [1, 2]:
            assert got != 4


def test_bad_word_prefix_allowed_when_context_differs():
    row = np.zeros(9, dtype=np.float32)
    row[5] = 9.0
    p = SamplingParams(temperature=0.0, bad_words_ids=[[3, 5]])
    assert int(sample(row[None].copy(), [make_seq(p, [1, 2], [4])])[0]) == 5   # context ends with 4
    assert int(sample(row[None].copy(), [make_seq(p, [1, 2], [3])])[0]) != 5   # context ends with 3
    assert int(sample(row[None].copy(), [make_seq(p, [1, 3], [])])[0]) != 5    # the prompt's last token counts
    # sampling (not only greedy) never draws a banned token
    seq = make_seq(SamplingParams(temperature=1.0, seed=1, bad_words_ids=[[5], [3, 6]]), [0], [3])
    row2 = np.zeros(9, dtype=np.float32)
    row2[5] = row2[6] = 4.0
    draws = sample(np.repeat(row2[None], 500, axis=0), [seq] * 500)
    assert 5 not in draws and 6 not in draws


# ---- logprobs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_top", [None, 0, 1, 5, 20])
def test_logprobs_of_raw_distribution(n_top):
    rng = np.random.default_rng(42)
    vocab = 64
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.9, seed=3, repetition_penalty=1.3,
                            presence_penalty=0.5, logprobs=n_top, compute_logprobs=n_top is None)
    seq = make_seq(params, [1, 2, 3])
    total = 0.0
    for step in range(12):
        row = (rng.standard_normal(vocab) * 3).astype(np.float32)
        tok = int(sample(row[None].copy(), [seq])[0])
        lp, top = seq.pending_logprobs[-1]
        ref = ref_log_softmax(row)  # the model's raw distribution: no penalty, temperature or filter
        assert abs(lp - ref[tok]) < 1e-6
        want = min(n_top or 0, vocab)
        assert len(top) == want
        order = np.argsort(-ref)[:want].tolist()
        assert [t for t, _ in top] == order
        assert all(abs(v - ref[t]) < 1e-6 for t, v in top)
        assert all(top[i][1] >= top[i + 1][1] for i in range(len(top) - 1))
        total += ref[tok]
        seq.append_token(tok)
    assert len(seq.pending_logprobs) == 12
    assert abs(seq.cumulative_logprob - total) < 1e-6
    assert abs(sum(lp for lp, _ in seq.pending_logprobs) - seq.cumulative_logprob) < 1e-9


def test_logprobs_skipped_unless_asked():
    """Without logprobs / compute_logprobs the per-row log-softmax is skipped: 0.0 is recorded
    (one entry per token still, so per-token outputs keep their length)."""
    row = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    seq = make_seq(SamplingParams(temperature=0.0), [0])
    assert int(sample(row[None].copy(), [seq])[0]) == 2
    assert seq.pending_logprobs == [(0.0, [])] and seq.cumulative_logprob == 0.0


def test_logprobs_more_than_vocab_is_clamped():
    row = np.array([0.0, 1.0, 2.0], dtype=np.float32)
    seq = make_seq(SamplingParams(temperature=0.0, logprobs=20), [0])
    assert int(sample(row[None].copy(), [seq])[0]) == 2
    _, top = seq.pending_logprobs[-1]
    assert [t for t, _ in top] == [2, 1, 0]


def test_greedy_logprob_when_penalty_changes_choice():
    """The chosen token's logprob is from the raw logits even when a penalty made it the choice."""
    row = np.array([5.0, 4.0, 0.0, 0.0], dtype=np.float32)
    seq = make_seq(SamplingParams(temperature=0.0, repetition_penalty=2.0, logprobs=2), [0])
    assert int(sample(row[None].copy(), [seq])[0]) == 1
    lp, top = seq.pending_logprobs[-1]
    ref = ref_log_softmax(row)
    assert abs(lp - ref[1]) < 1e-6
    assert [t for t, _ in top] == [0, 1]


# ---- stop ids, min_tokens, ignore_eos --------------------------------------------------------------
def test_stop_token_ids_end_with_stop():
    seq = make_seq(SamplingParams(temperature=0.0, stop_token_ids=[9, 11]), [1, 2])
    for tok, want in ((4, None), (11, "stop")):
        seq.append_token(tok)
        assert seq.check_stop(1000) == want
    seq = make_seq(SamplingParams(temperature=0.0), [1, 2], eos=(9,))
    seq.append_token(9)
    assert seq.check_stop(1000) == "stop"


def test_min_tokens_with_stop_ids_and_eos():
    """Before min_tokens outputs exist, neither EOS nor stop ids may be sampled, greedy or not;
    the first token after that may be either, and stops."""
    v = 16
    row = np.zeros(v, dtype=np.float32)
    row[EOS], row[9], row[10] = 30.0, 29.0, 20.0  # stop id 9 is the runner-up, 10 the next
    for temperature in (0.0, 1.0):
        seq = make_seq(SamplingParams(temperature=temperature, min_tokens=4, stop_token_ids=[9], seed=1), [1])
        got = []
        while True:
            tok = int(sample(row[None].copy(), [seq])[0])
            seq.append_token(tok)
            got.append(tok)
            if seq.check_stop(1000):
                break
        assert len(got) == 5 and all(t not in (EOS, 9) for t in got[:4])
        assert got[4] in (EOS, 9) and seq.check_stop(1000) == "stop"
        if temperature == 0.0:
            assert got == [10, 10, 10, 10, EOS]


def test_ignore_eos_keeps_going_but_stop_ids_still_stop():
    row = np.zeros(12, dtype=np.float32)
    row[EOS] = 20.0
    seq = make_seq(SamplingParams(temperature=0.0, ignore_eos=True, stop_token_ids=[7]), [1], max_tokens=5)
    for i in range(4):
        tok = int(sample(row[None].copy(), [seq])[0])
        assert tok == EOS  # ignore_eos does not ban EOS, it only stops it from ending the request
        seq.append_token(tok)
        assert seq.check_stop(1000) is None
    seq.append_token(7)
    assert seq.check_stop(1000) == "stop"
    seq2 = make_seq(SamplingParams(temperature=0.0, ignore_eos=True), [1], max_tokens=3)
    for _ in range(3):
        seq2.append_token(EOS)
    assert seq2.check_stop(1000) == "length"


def test_rows_in_one_batch_use_their_own_parameters():
    """One call, four rows with identical logits and different parameters: each row's choice equals
    the choice it gets alone."""
    row = np.array([3.0, 2.9, 2.8, 2.7, 0.0, 0.0, 0.0, 0.0], dtype=np.float32)
    specs = [
        (SamplingParams(temperature=0.0), [0], [], [EOS]),
        (SamplingParams(temperature=0.0, repetition_penalty=2.0), [0], [], [EOS]),       # 0 penalised -> 1
        (SamplingParams(temperature=0.0, presence_penalty=1.0), [4], [0, 1], [EOS]),     # 0, 1 penalised -> 2
        (SamplingParams(temperature=0.0, bad_words_ids=[[0], [1], [2]]), [0], [], [EOS]),  # -> 3
        (SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[0, 1]), [5], [], [2]),  # 0, 1, 2 banned
    ]
    seqs = [make_seq(p, pr, out, eos=eos) for p, pr, out, eos in specs]
    batched = sample(np.repeat(row[None], len(seqs), axis=0), seqs).tolist()
    alone = [int(sample(row[None].copy(), [make_seq(p, pr, out, eos=eos)])[0]) for p, pr, out, eos in specs]
    assert batched == alone == [0, 1, 2, 3, 3]
