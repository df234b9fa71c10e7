"""SamplingParams.validate: every bad value raises InvalidRequestError naming its field."""

from __future__ import annotations

import pytest

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError
from paddle_llm_engine.sampling_params import SamplingParams

VOCAB = 1000


@pytest.mark.parametrize("kwargs,field", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -2}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": float("nan")}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"stop_token_ids": [5, VOCAB]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"eos_token_ids": [VOCAB + 3]}, "eos_token_ids"),  # the contracts call it end_id (test_contracts.py)
    ({"stop": ["ok", ""]}, "stop"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3.0}, "frequency_penalty"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
])
def test_bad_value_names_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as ei:
        SamplingParams(**kwargs).validate(VOCAB)
    assert ei.value.field == field
    assert str(ei.value).startswith(f"{field}:")
    assert isinstance(ei.value, ValueError)
    assert ei.value.code is ErrorCode.INVALID_SAMPLING_PARAM


@pytest.mark.parametrize("kwargs", [
    {},
    {"temperature": 0.0},
    {"top_k": -1}, {"top_k": 0}, {"top_k": 1}, {"top_k": 50},
    {"top_p": 1.0}, {"top_p": 1e-9},
    {"max_tokens": 1, "min_tokens": 1},
    {"seed": 0}, {"seed": 2**64 - 1},
    {"stop_token_ids": [0, VOCAB - 1], "eos_token_ids": [2]},
    {"stop": ["\n\n", "END"]},
    {"min_p": 0.0}, {"min_p": 1.0},
    {"repetition_penalty": 1.3, "presence_penalty": -2.0, "frequency_penalty": 2.0},
    {"logprobs": 0}, {"logprobs": 20},
])
def test_valid_values_pass(kwargs):
    SamplingParams(**kwargs).validate(VOCAB)


def test_greedy_property():
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(temperature=0.7, top_k=1).greedy
    assert not SamplingParams(temperature=0.7).greedy
