"""The vLLM-backend contract of `llm` beyond the basics: sampling parameters from the request's
Triton parameters (same conversions and error texts as the `sampling_parameters` tensor), one error
form `sampling_parameters.<key>` for type and range errors, the vLLM SamplingParams keys implemented
here (include_stop_str_in_output, spaces_between_special_tokens, logit_bias, allowed_token_ids,
truncate_prompt_tokens) from the contract through the sampler / detokenizer / engine, the known vLLM
keys that are refused as such, and the `default_max_tokens` model parameter."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paddle_llm_engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.sampler import sample as sample_rows
from paddle_llm_engine.sampler import token_logprobs
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.sequence import Sequence
from paddle_llm_triton.config_params import serving_options
from paddle_llm_triton.contracts.vllm import (INPUT_FLAGS, UNSUPPORTED_VLLM_KEYS, check_max_tokens,
                                              from_request_parameters, from_vllm_json, to_json)
from sampling_reference import sampling_state

VOCAB = 1000


def error_of(fn, *args) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as ei:
        fn(*args)
    return ei.value


def tensor(obj: dict) -> SamplingParams:
    return from_vllm_json(json.dumps(obj), VOCAB)


# -- one error form, whichever way the key came ------------------------------------------------------

@pytest.mark.parametrize("obj, key", [
    ({"temperature": "abc"}, "temperature"),          # type errors
    ({"max_tokens": "four"}, "max_tokens"),
    ({"ignore_eos": "maybe"}, "ignore_eos"),
    ({"logit_bias": [1, 2]}, "logit_bias"),
    ({"top_p": "0"}, "top_p"),                         # range errors (the engine's rules)
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": "-0.5"}, "temperature"),
    ({"top_k": "-5"}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"logprobs": 21}, "logprobs"),
    ({"seed": -1}, "seed"),
    ({"stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ({"end_id": -1}, "end_id"),
    ({"stop": [""]}, "stop"),
    ({"logit_bias": {str(VOCAB): 1.0}}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [3, VOCAB + 1]}, "allowed_token_ids"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"n": 0}, "n"),
    ({"n": 65}, "n"),
])
def test_type_and_range_errors_name_sampling_parameters_key_on_both_paths(obj, key):
    e1 = error_of(tensor, obj)
    assert e1.field == f"sampling_parameters.{key}" and str(e1).startswith(f"sampling_parameters.{key}: ")
    e2 = error_of(from_request_parameters, json.dumps(obj), VOCAB)
    assert str(e2) == str(e1), "request parameters must give the tensor path's error text"


def test_without_vocab_only_conversion_is_checked():
    """The ensemble's internal JSON (already validated by preprocessing) is parsed without ranges."""
    assert from_vllm_json('{"top_p": 0}').top_p == 0.0
    assert from_vllm_json(None) == SamplingParams() == from_vllm_json("  ")


def test_typo_is_unknown_key_and_known_vllm_keys_say_they_are_not_supported():
    e = error_of(tensor, {"temprature": 0})
    assert e.field == "sampling_parameters.temprature" and "unknown key" in str(e)
    assert "prompt_logprobs" in str(e)  # the message lists the vLLM keys not supported here
    for key in UNSUPPORTED_VLLM_KEYS:
        bad = {"use_beam_search": True, "length_penalty": 0.5, "early_stopping": True, "detokenize": False}.get(key, 1)
        e = error_of(tensor, {key: bad})
        assert e.field == f"sampling_parameters.{key}"
        assert "vLLM sampling parameter that this server does not support" in str(e), str(e)


def test_no_op_values_of_unsupported_vllm_keys_and_nulls_are_accepted():
    """Clients that serialise every SamplingParams field send these; they change nothing."""
    p = tensor({"use_beam_search": "false", "length_penalty": "1.0", "early_stopping": False, "detokenize": True,
                "prompt_logprobs": None, "lora_name": None, "temperature": None, "seed": None})
    assert p == SamplingParams()


def test_new_keys_convert_including_the_string_forms_of_request_parameters():
    p = tensor({"include_stop_str_in_output": "true", "spaces_between_special_tokens": "false",
                "logit_bias": {"5": "2.5", 7: -100}, "allowed_token_ids": [3, "4", 5], "truncate_prompt_tokens": "8"})
    assert p.include_stop_str_in_output is True and p.spaces_between_special_tokens is False
    assert p.logit_bias == {5: 2.5, 7: -100.0} and p.allowed_token_ids == [3, 4, 5] and p.truncate_prompt_tokens == 8
    # a request parameter is a scalar: lists and objects arrive as JSON strings
    q, _ = from_request_parameters(json.dumps({"logit_bias": '{"5": 2.5, "7": -100}', "allowed_token_ids": "[3, 4, 5]",
                                               "stop_token_ids": "[9]", "truncate_prompt_tokens": -1}), VOCAB)
    assert q.logit_bias == {5: 2.5, 7: -100.0} and q.allowed_token_ids == [3, 4, 5] and q.stop_token_ids == [9]
    assert q.truncate_prompt_tokens == -1
    assert error_of(from_request_parameters, '{"allowed_token_ids": "[1, "}', VOCAB).field == \
        "sampling_parameters.allowed_token_ids"
    # the JSON between the ensemble's steps keeps them
    assert from_vllm_json(to_json(p)) == p


# -- request parameters ------------------------------------------------------------------------------

def test_request_parameters_of_the_vllm_quick_start_body():
    """What Triton 2.51's generate endpoint makes of {"text_input": ..., "parameters": {"stream": false,
    "temperature": 0, "max_tokens": 20}} (measured: stream becomes the input tensor, the rest the
    request's parameters) and what a gRPC client sends as parameters=."""
    p, flags = from_request_parameters('{"temperature": 0, "max_tokens": 20}', VOCAB)
    assert (p.temperature, p.max_tokens, flags) == (0.0, 20, {})
    p, flags = from_request_parameters({"stream": False, "temperature": "0", "top_p": "1", "logprobs": 2,
                                        "return_finish_reason": "true"}, VOCAB)
    assert (p.temperature, p.top_p, p.logprobs) == (0.0, 1.0, 2)
    assert flags == {"stream": False, "return_finish_reason": True}
    assert set(INPUT_FLAGS) >= set(flags)
    assert from_request_parameters("", VOCAB) == (SamplingParams(), {})
    assert from_request_parameters("{}", VOCAB) == (SamplingParams(), {})


def test_request_parameters_skip_tritons_own_and_take_a_sampling_parameters_string():
    p, _ = from_request_parameters({"priority": 0, "timeout": 100000, "sequence_id": 0, "binary_data_output": False,
                                    "triton_enable_empty_final_response": True, "seed": 7}, VOCAB)
    assert p == SamplingParams(seed=7)
    p, flags = from_request_parameters({"sampling_parameters": '{"temperature": "0.5"}', "stream": True,
                                        "max_tokens": 3}, VOCAB)
    assert p == SamplingParams(temperature=0.5) and flags == {"stream": True}  # as the tensor would be
    assert error_of(from_request_parameters, {"stream": "sometimes"}, VOCAB).field == "stream"


def test_max_tokens_that_do_not_fit_name_the_key():
    check_max_tokens(SamplingParams(max_tokens=10), 90, 100)
    check_max_tokens(SamplingParams(), 99, 100)
    e = error_of(check_max_tokens, SamplingParams(max_tokens=11), 90, 100)
    assert e.field == "sampling_parameters.max_tokens" and "max_model_len (100)" in str(e)


# -- sampler: logit_bias, allowed_token_ids, rank ----------------------------------------------------

def seq_of(params: SamplingParams, prompt=(5, 6, 7)) -> Sequence:
    return Sequence("r", list(prompt), params, 100, [2])


def sample(x, seqs):
    """The sampler on these sequences, each with its sampling state as the engine derives it."""
    return sample_rows(x, seqs, [sampling_state(s) for s in seqs])


def logits(v=50, seed=0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((1, v)) * 3).astype(np.float32)


def test_logit_bias_moves_the_greedy_choice_and_leaves_the_logits_alone():
    x = logits()
    low = int(np.argmin(x[0]))
    before = x.copy()
    tok, _ = sample(x, [seq_of(SamplingParams(temperature=0.0, logit_bias={low: 100.0}))])
    assert int(tok[0]) == low
    assert np.array_equal(x, before), "the step's logits must not be modified"
    tok, _ = sample(x, [seq_of(SamplingParams(temperature=0.0, logit_bias={int(np.argmax(x[0])): -100.0}))])
    assert int(tok[0]) == int(np.argsort(-x[0])[1])


def test_allowed_token_ids_restrict_greedy_and_sampled_tokens():
    x = logits()
    allowed = [3, 11, 29]
    tok, _ = sample(x, [seq_of(SamplingParams(temperature=0.0, allowed_token_ids=allowed))])
    assert int(tok[0]) == allowed[int(np.argmax(x[0, allowed]))]
    prm = SamplingParams(temperature=1.5, seed=3, allowed_token_ids=allowed, logit_bias={11: 2.0})
    seq = seq_of(prm)
    drawn = {int(sample(x, [seq])[0][0]) for _ in range(200)}
    assert drawn <= set(allowed) and len(drawn) > 1
    st = sampling_state(seq)  # arrays built once, in the request's state (never on the params), then reused
    assert st.allowed.tolist() == allowed and st.bias_ids.tolist() == [11] and "_sampler_arrays" not in vars(prm)


def test_sampled_token_rank_is_its_rank_in_the_vocabulary_even_without_alternatives():
    x = logits()
    for k, tok in ((0, int(np.argsort(-x[0])[4])), (2, int(np.argsort(-x[0])[0]))):
        lp, top = token_logprobs(x[0], tok, k, with_rank=True)
        assert top.rank == 1 + int((x[0] > x[0, tok]).sum())
        assert len(top) == k
    # logprobs=0 through the sampler: no alternatives, still a rank
    _, lps = sample(x, [seq_of(SamplingParams(temperature=0.0, logprobs=0))])
    assert lps[0][1] == [] and lps[0][1].rank == 1
    # cumulative logprob only (no `logprobs` asked): no rank computed
    _, lps = sample(x, [seq_of(SamplingParams(temperature=0.0, compute_logprobs=True))])
    assert getattr(lps[0][1], "rank", None) is None


# -- detokenizer: include_stop_str_in_output, spaces_between_special_tokens --------------------------

def test_include_stop_str_in_output_keeps_the_stop_string():
    m = StopStringMatcher(["STOP"], include_stop=True)
    out = [m.push(d) for d in ("abc S", "TO", "P and more")]
    assert "".join(t for t, _ in out) == "abc STOP" and out[-1][1] is True
    m = StopStringMatcher(["STOP"])
    assert "".join(m.push(d)[0] for d in ("abc S", "TO", "P and more")) == "abc "


def test_spaces_between_special_tokens_reaches_the_tokenizer_only_when_false():
    class Tok:
        def __init__(self):
            self.kwargs = []

        def decode(self, ids, **kw):
            self.kwargs.append(kw)
            return "x" * len(ids)

    t = Tok()
    IncrementalDetokenizer(t, [1, 2], skip_special_tokens=False).add([3])
    assert all("spaces_between_special_tokens" not in kw for kw in t.kwargs)
    t = Tok()
    IncrementalDetokenizer(t, [1, 2], skip_special_tokens=False, spaces_between_special_tokens=False).add([3])
    assert t.kwargs and all(kw["spaces_between_special_tokens"] is False for kw in t.kwargs)


# -- engine: truncate_prompt_tokens, include_stop_str_in_output --------------------------------------

def test_truncate_prompt_tokens_keeps_the_last_tokens(tiny_model_dir):
    from test_engine_tiny import MAX_LEN, make_engine, prompt, run

    eng = make_engine(tiny_model_dir)
    ids = prompt(40, salt=3)
    greedy = dict(temperature=0.0, ignore_eos=True, max_tokens=4)
    res = run(eng, {"t": (ids, SamplingParams(truncate_prompt_tokens=10, **greedy)),
                    "s": (ids[-10:], SamplingParams(**greedy))})
    assert res["t"]["tokens"] == res["s"]["tokens"]
    eng.add_request("n", ids, SamplingParams(truncate_prompt_tokens=10, **greedy))
    assert eng.requests["n"].seq.num_prompt_tokens == 10
    eng.abort_request("n")
    long = prompt(MAX_LEN + 20, salt=4)  # longer than max_model_len: -1 keeps the last MAX_LEN - 1
    eng.add_request("m", long, SamplingParams(truncate_prompt_tokens=-1, temperature=0.0, max_tokens=1))
    assert eng.requests["m"].seq.num_prompt_tokens == MAX_LEN - 1
    eng.abort_request("m")
    with pytest.raises(InvalidRequestError):
        eng.add_request("x", long, SamplingParams(max_tokens=1))


# -- default_max_tokens ------------------------------------------------------------------------------

def _cfg(**params) -> dict:
    return {"parameters": {k: {"string_value": v} for k, v in params.items()}}


def test_default_max_tokens_parameter():
    assert serving_options(_cfg()).default_max_tokens == 0
    assert serving_options(_cfg(default_max_tokens="")).default_max_tokens == 0
    assert serving_options(_cfg(default_max_tokens="16")).default_max_tokens == 16
    for bad in ("-1", "many"):
        with pytest.raises(ValueError, match="default_max_tokens"):
            serving_options(_cfg(default_max_tokens=bad))


def test_priority_is_a_sampling_parameters_key_and_triton_keeps_its_own():
    assert tensor({"priority": -3}).priority == -3 and tensor({}).priority == 0
    for bad in ("high", 2**31):
        assert error_of(tensor, {"priority": bad}).field == "sampling_parameters.priority"
    # a request parameter `priority` is Triton's own request priority (its HTTP server reads it; the
    # Python backend of Triton 2.51 does not pass it on), so only sampling_parameters carries ours
    assert from_request_parameters(json.dumps({"priority": 2, "temperature": 0}), VOCAB)[0].priority == 0
    nested = {"sampling_parameters": json.dumps({"priority": 4})}
    assert from_request_parameters(json.dumps(nested), VOCAB)[0].priority == 4
