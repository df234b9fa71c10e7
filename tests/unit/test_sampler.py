"""Sampler: greedy paths, per-request seeded RNG independent of batch mates, the sampled
distribution against softmax (chi-square), and min_tokens suppressing EOS / stop ids."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.sequence import Sequence
from sampling_reference import sample  # the sampler's tokens, logprobs recorded as the engine does


EOS = 2
# Chi-square critical values at alpha = 0.001 by degrees of freedom (scipy.stats.chi2.ppf(0.999, df)).
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}


def seq_with(params: SamplingParams, prompt=(5, 6, 7), max_tokens=100) -> Sequence:
    return Sequence("r", list(prompt), params, max_tokens, [EOS])


def rand_logits(b: int, v: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((b, v)) * 3).astype(np.float32)


def test_greedy_is_argmax():
    logits = rand_logits(6, 1000)
    seqs = [seq_with(SamplingParams(temperature=0.0)) for _ in range(6)]
    assert sample(logits, seqs).tolist() == logits.argmax(axis=1).tolist()


def test_top_k_1_equals_greedy():
    logits = rand_logits(6, 1000, seed=1)
    seqs = [seq_with(SamplingParams(temperature=1.5, top_k=1, seed=i)) for i in range(6)]
    for _ in range(5):
        assert sample(logits, seqs).tolist() == logits.argmax(axis=1).tolist()


def test_tiny_top_p_is_argmax():
    logits = rand_logits(4, 500, seed=2)
    seqs = [seq_with(SamplingParams(temperature=1.0, top_p=1e-6, seed=i)) for i in range(4)]
    for _ in range(20):
        assert sample(logits, seqs).tolist() == logits.argmax(axis=1).tolist()


def test_same_seed_same_draws_regardless_of_batch_mates():
    v = 50
    logits_a = rand_logits(30, v, seed=3) / 3  # flat enough that draws vary
    alone = seq_with(SamplingParams(temperature=1.0, seed=1234))
    draws_alone = [int(sample(logits_a[k:k + 1], [alone])[0]) for k in range(30)]
    assert len(set(draws_alone)) > 5  # really random, not argmax

    target = seq_with(SamplingParams(temperature=1.0, seed=1234))
    mates = [seq_with(SamplingParams(temperature=0.8, top_p=0.9, seed=7)),
             seq_with(SamplingParams(temperature=0.0)),
             seq_with(SamplingParams(temperature=1.2, top_k=5, seed=1234))]  # same seed, own generator
    others = rand_logits(30, v, seed=4)
    draws_batched = []
    for k in range(30):
        # Vary the batch: position of the target row and which mates are present change every step.
        group = mates[: k % 4]
        pos = k % (len(group) + 1)
        seqs = group[:pos] + [target] + group[pos:]
        rows = [others[(k + j) % 30] for j in range(len(group))]
        rows.insert(pos, logits_a[k])
        draws_batched.append(int(sample(np.stack(rows), seqs)[pos]))
    assert draws_batched == draws_alone


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    assert expected.min() >= 5, "test design: every cell needs >= 5 expected draws"
    return float(((counts - expected) ** 2 / expected).sum())


def _draw(params: SamplingParams, row: np.ndarray, n: int) -> np.ndarray:
    seq = seq_with(params)
    return sample(np.repeat(row[None, :], n, axis=0), [seq] * n)


def test_sampled_distribution_matches_softmax():
    row = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -2.5], dtype=np.float32)
    draws = _draw(SamplingParams(temperature=1.0, seed=2024), row, 4000)
    p = np.exp(row.astype(np.float64) - row.max())
    p /= p.sum()
    counts = np.bincount(draws, minlength=row.size)
    assert _chi2(counts, p) < CHI2_999[row.size - 1]


def test_temperature_and_top_k_distribution():
    row = np.array([1.0, 0.6, 0.3, -0.5, -1.0, 0.9], dtype=np.float32)
    t, k = 0.7, 3
    draws = _draw(SamplingParams(temperature=t, top_k=k, seed=99), row, 4000)
    counts = np.bincount(draws, minlength=row.size)
    keep = np.argsort(-row)[:k]  # ids 0, 5, 1
    assert counts[np.setdiff1d(np.arange(row.size), keep)].sum() == 0
    x = row[keep].astype(np.float64) / t
    p = np.exp(x - x.max())
    p /= p.sum()
    assert _chi2(counts[keep], p) < CHI2_999[k - 1]


def test_top_p_keeps_smallest_set_reaching_p():
    # probs ~ [0.5, 0.3, 0.2]: top_p 0.6 keeps {0, 1}; 0.5 keeps {0} only.
    row = np.log(np.array([0.5, 0.3, 0.2])).astype(np.float32)
    counts = np.bincount(_draw(SamplingParams(top_p=0.6, seed=5), row, 2000), minlength=3)
    assert counts[2] == 0 and counts[0] > 0 and counts[1] > 0
    assert _chi2(counts[:2], np.array([0.625, 0.375])) < CHI2_999[1]
    counts = np.bincount(_draw(SamplingParams(top_p=0.5, seed=5), row, 200), minlength=3)
    assert counts.tolist() == [200, 0, 0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_suppresses_eos_and_stop_ids(temperature):
    v = 20
    row = np.zeros(v, dtype=np.float32)
    row[EOS], row[9], row[4] = 50.0, 40.0, 10.0  # EOS dominant, then stop id 9, then 4
    params = SamplingParams(temperature=temperature, min_tokens=3, stop_token_ids=[9], seed=0)
    seq = seq_with(params)
    for _ in range(3):
        tok = int(sample(row[None, :], [seq])[0])
        assert tok not in (EOS, 9)
        if temperature == 0.0:
            assert tok == 4
        seq.append_token(tok)
        assert seq.check_stop(1000) is None
    assert int(sample(row[None, :], [seq])[0]) == EOS  # min_tokens reached: EOS allowed again
    # The caller's logits are not modified by the suppression.
    assert row[EOS] == 50.0 and row[9] == 40.0


def test_min_tokens_with_ignore_eos_still_suppresses_stop_ids():
    row = np.zeros(10, dtype=np.float32)
    row[EOS], row[7] = 9.0, 8.0
    seq = seq_with(SamplingParams(temperature=0.0, min_tokens=1, stop_token_ids=[EOS, 7], ignore_eos=True))
    assert int(sample(row[None, :], [seq])[0]) not in (EOS, 7)
