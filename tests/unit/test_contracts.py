"""The two client contracts (paddle_llm_triton/contracts/): where TensorRT-LLM's rules differ from the
engine's (top_p 0, top_k -1, the greedy default) and that the vLLM contract keeps the engine's."""

from __future__ import annotations

import json

import pytest

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_triton.contracts.trtllm import from_trtllm_tensors
from paddle_llm_triton.contracts.vllm import from_vllm_json, to_json

VOCAB = 1000


def field_of(fn, *args) -> str:
    with pytest.raises(InvalidRequestError) as ei:
        fn(*args)
    return ei.value.field


# -- TensorRT-LLM ------------------------------------------------------------------------------------

def test_trtllm_top_p_0_is_off_and_top_k_has_no_minus_one():
    p = from_trtllm_tensors({"top_p": 0.0, "top_k": 5, "temperature": 0.7}, VOCAB)
    assert p.top_p == 1.0 and p.top_k == 5 and p.temperature == 0.7
    assert field_of(from_trtllm_tensors, {"top_k": -1}, VOCAB) == "top_k"
    assert field_of(from_trtllm_tensors, {"top_p": 1.5}, VOCAB) == "top_p"
    assert field_of(from_trtllm_tensors, {"top_p": -0.1}, VOCAB) == "top_p"


def test_trtllm_greedy_without_top_k_and_top_p_but_temperature_checked_first():
    assert from_trtllm_tensors({"temperature": 0.9}, VOCAB).temperature == 0.0
    assert from_trtllm_tensors({"temperature": 0.9, "top_k": 0, "top_p": 0.0}, VOCAB).temperature == 0.0
    assert from_trtllm_tensors({"temperature": 0.9, "top_p": 0.5}, VOCAB).temperature == 0.9
    assert field_of(from_trtllm_tensors, {"temperature": -1.0}, VOCAB) == "temperature"


@pytest.mark.parametrize("values, field", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"end_id": VOCAB}, "end_id"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"beam_width": 2}, "beam_width"),
    ({"num_return_sequences": 0}, "num_return_sequences"),
    ({"num_return_sequences": 65}, "num_return_sequences"),
    ({"length_penalty": 0.5}, "length_penalty"),
    ({"seed": 1, "random_seed": 2}, "seed"),
    ({"min_tokens": 1, "min_length": 2}, "min_tokens"),
])
def test_trtllm_bad_values_name_the_tensor(values, field):
    assert field_of(from_trtllm_tensors, values, VOCAB) == field


def test_trtllm_names_map_to_params_and_survive_the_json_between_the_steps():
    p = from_trtllm_tensors({"max_tokens": 8, "random_seed": 7, "min_length": 2, "end_id": 3, "top_k": 40,
                             "stop_words": ["a", ""], "bad_words": ["b"]}, VOCAB)
    assert (p.max_tokens, p.seed, p.min_tokens, p.eos_token_ids, p.stop, p.bad_words) == (8, 7, 2, [3], ["a"], ["b"])
    assert from_vllm_json(to_json(p)) == p


# -- vLLM --------------------------------------------------------------------------------------------

def test_vllm_ranges_are_the_engines():
    """The engine's validate judges (top_p 0 is an error, top_k -1 is off), run by the contract with the
    vocabulary size, under the contract's name for the key (one form with the type errors)."""
    assert field_of(from_vllm_json, json.dumps({"top_p": "0"}), VOCAB) == "sampling_parameters.top_p"
    assert field_of(from_vllm_json(json.dumps({"top_p": "0"})).validate, VOCAB) == "top_p"  # the engine's own
    from_vllm_json(json.dumps({"top_k": "-1"}), VOCAB).validate(VOCAB)
    assert from_vllm_json(None) == SamplingParams() == from_vllm_json("  ")


def test_vllm_unknown_keys_and_bad_types_name_the_key():
    assert field_of(from_vllm_json, '{"no_such_key": 1}') == "sampling_parameters.no_such_key"
    assert field_of(from_vllm_json, '{"max_tokens": "four"}') == "sampling_parameters.max_tokens"
    assert field_of(from_vllm_json, '{"n": "two"}') == "sampling_parameters.n"
    assert from_vllm_json('{"n": 2}', VOCAB).n == 2  # served in the vLLM backend's form (vllm_request.py)
    assert field_of(from_vllm_json, "[1]") == "sampling_parameters"


def test_trtllm_num_return_sequences_sets_n():
    assert from_trtllm_tensors({"num_return_sequences": 3}, VOCAB).n == 3
    assert from_trtllm_tensors({}, VOCAB).n == 1
