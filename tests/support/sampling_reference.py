"""The independent numpy reference of the sampler's rules and the helpers of test_sampling_reference.py
(nothing here is imported from the sampler's helpers): repetition penalty (HF / CTRL rule over prompt
+ output), presence / frequency penalties (OpenAI rule over output tokens), bad words, softmax,
top-k / top-p / min_p, and a chi-square goodness-of-fit check of seeded draws."""

from __future__ import annotations

from collections import Counter

import numpy as np

from paddle_llm_engine.sampler import SamplingState
from paddle_llm_engine.sampler import sample as sample_step
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.sequence import Sequence


def sampling_state(seq: Sequence) -> SamplingState:
    """The sequence's sampling state as the engine's request state derives it, made once per
    sequence object (so that its generator advances across calls, as in the engine)."""
    st = seq.__dict__.get("_test_sampling_state")
    if st is None:
        prm = seq.params
        st = SamplingState.create(prm, seq.seq_index, seq.eos_token_ids, prm.bad_words_ids)
        seq.__dict__["_test_sampling_state"] = st
    return st


def sample(logits, seqs):
    """The sampler's token ids; each row's logprob is recorded on its sequence as the engine does
    when it applies a step's result."""
    tokens, logprobs = sample_step(logits, seqs, [sampling_state(s) for s in seqs])
    for seq, lp in zip(seqs, logprobs):
        seq.record_logprob(*lp)
    return tokens


EOS = 2
# scipy.stats.chi2.ppf(0.999, df) for df = 1..12
CHI2_999 = [None, 10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264, 32.909]


# ---- the reference ---------------------------------------------------------------------------------
def ref_repetition(x: np.ndarray, history: list[int], penalty: float) -> np.ndarray:
    """CTRL / HF RepetitionPenaltyLogitsProcessor: every token seen (prompt or output), once."""
    x = np.array(x, dtype=np.float64)
    for t in set(history):
        x[t] = x[t] / penalty if x[t] > 0 else x[t] * penalty
    return x


def ref_presence_frequency(x: np.ndarray, output: list[int], presence: float, frequency: float) -> np.ndarray:
    """OpenAI: logit[t] -= count[t] * frequency + (count[t] > 0) * presence, counts over output only."""
    x = np.array(x, dtype=np.float64)
    for t, c in Counter(output).items():
        x[t] -= c * frequency + presence
    return x


def ref_bad_words(x: np.ndarray, history: list[int], words: list[list[int]]) -> np.ndarray:
    x = np.array(x, dtype=np.float64)
    for w in words:
        prefix = w[:-1]
        if not prefix or history[len(history) - len(prefix):] == prefix:
            x[w[-1]] = -np.inf
    return x


def ref_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def ref_log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def ref_distribution(x: np.ndarray, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     min_p: float = 0.0) -> np.ndarray:
    """HF warper order: temperature, top-k, top-p (on the top-k renormalized distribution), min-p."""
    z = np.asarray(x, dtype=np.float64) / temperature
    if top_k > 0:
        order = sorted(range(len(z)), key=lambda i: -z[i])
        kth = z[order[top_k - 1]]
        z = np.where(z >= kth, z, -np.inf)
    p = ref_softmax(z)
    if top_p < 1.0:
        keep = np.zeros(len(p), dtype=bool)
        mass = 0.0
        for i in sorted(range(len(p)), key=lambda i: -p[i]):
            if mass >= top_p:  # the tokens before already reach top_p
                break
            keep[i] = True
            mass += p[i]
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    if min_p > 0.0:  # element by element, like top-p above: no code shared with the sampler
        floor = min_p * max(p)
        p = np.array([q if q >= floor else 0.0 for q in p], dtype=np.float64)
        p /= p.sum()
    return p


# ---- helpers ---------------------------------------------------------------------------------------
def make_seq(params: SamplingParams, prompt: list[int], output: list[int] = (), eos=(EOS,),
             max_tokens: int = 1000) -> Sequence:
    seq = Sequence("r", list(prompt), params, max_tokens, list(eos))
    for t in output:
        seq.append_token(t)
    return seq


def chi2_critical(df: int) -> float:
    """0.999 quantile of chi-square: the table for small df, Wilson-Hilferty above (within 1%)."""
    if df < len(CHI2_999):
        return CHI2_999[df]
    z = 3.0902  # standard normal 0.999 quantile
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def chi2_ok(counts: np.ndarray, probs: np.ndarray) -> bool:
    """Chi-square goodness of fit over the support of probs (draws outside it are checked by the
    callers); cells with < 5 expected draws are pooled into one, or into the smallest cell."""
    support = probs > 0
    counts, probs = counts[support], probs[support]
    exp = probs * counts.sum()
    big = exp >= 5
    obs_cells = list(counts[big]) + ([counts[~big].sum()] if (~big).any() else [])
    exp_cells = list(exp[big]) + ([exp[~big].sum()] if (~big).any() else [])
    obs_cells, exp_cells = np.asarray(obs_cells, float), np.asarray(exp_cells, float)
    if exp_cells[-1] < 5 and len(exp_cells) > 1:
        obs_cells[-2] += obs_cells[-1]
        exp_cells[-2] += exp_cells[-1]
        obs_cells, exp_cells = obs_cells[:-1], exp_cells[:-1]
    df = len(exp_cells) - 1
    if df == 0:
        return True
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
    return stat < chi2_critical(df)


def draw(params: SamplingParams, row: np.ndarray, n: int, prompt=(5, 6, 7)) -> np.ndarray:
    seq = make_seq(params, list(prompt))
    return sample(np.repeat(row[None, :].astype(np.float32), n, axis=0), [seq] * n)


def greedy_trials(n_trials: int, vocab: int, make_params, reference, seed: int):
    """For random rows and histories: sampler's greedy pick == argmax of the reference-processed row.
    Returns the fraction of trials where processing changed the argmax."""
    rng = np.random.default_rng(seed)
    changed = 0
    for trial in range(n_trials):
        row = (rng.standard_normal(vocab) * 2.0).astype(np.float32)
        prompt = rng.integers(0, vocab, size=int(rng.integers(1, 12))).tolist()
        output = rng.integers(0, vocab, size=int(rng.integers(0, 12))).tolist()
        params = make_params(rng)
        seq = make_seq(params, prompt, output, eos=())
        ref = reference(row, prompt, output, params)
        top2 = np.sort(ref[np.isfinite(ref)])[-2:]
        if len(top2) == 2 and top2[1] - top2[0] < 1e-4:
            continue  # a near-tie: float32 vs float64 rounding may pick either
        got = int(sample(row[None, :].copy(), [seq])[0])
        assert got == int(np.argmax(ref)), f"trial {trial}: params {params}"
        changed += int(np.argmax(ref) != np.argmax(row))
    return changed / n_trials
