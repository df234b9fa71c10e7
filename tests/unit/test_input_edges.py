"""The last rough edges of bad input (issue 14 section 5) and the request-level settings of the
limits: inf / NaN in every float input of both contracts, ensemble errors named by the ensemble's
own tensors (never `sampling_parameters.`), a prompt that alone exceeds max_model_len named as
such, the vLLM backend's exact streamed exclude_input_in_output refusal, the request timeout as
Triton 2.51 delivers it, and the config.pbtxt names of the limits."""

from __future__ import annotations

import json
import logging
import math

import pytest

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError
from paddle_llm_engine.sampling_params import FLOAT_FIELDS, SamplingParams, check_prompt_length
from paddle_llm_triton.config_params import engine_config_from_triton
from paddle_llm_triton.contracts import trtllm
from paddle_llm_triton.contracts.trtllm import from_pipeline_json, from_trtllm_tensors
from paddle_llm_triton.contracts.values import triton_error
from paddle_llm_triton.contracts.vllm import (STREAM_PROMPT_REFUSAL, check_max_tokens, check_stream_prompt,
                                              from_request_parameters, from_vllm_json, to_json)
from paddle_llm_triton.contracts.timeout import timeout_seconds, timeout_us

VOCAB = 1000
NON_FINITE = [math.inf, -math.inf, math.nan]


def error_of(fn, *args) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as ei:
        fn(*args)
    return ei.value


# -- inf / NaN ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", trtllm.FLOAT_TENSORS)
@pytest.mark.parametrize("value", NON_FINITE, ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "top_k"])
def test_trtllm_non_finite_floats_are_refused_naming_the_tensor(name, value, sampled):
    values = {name: value, **({"top_k": 5} if sampled else {})}
    e = error_of(from_trtllm_tensors, values, VOCAB)
    assert e.field == name
    assert str(e) == f"{name}: must be a finite number, got {value}"


def test_trtllm_temperature_inf_on_a_greedy_request_was_the_hole():
    """Without top_k / top_p TensorRT-LLM decodes greedily, which rewrote the temperature and hid
    an inf; a finite temperature is still rewritten as before."""
    assert str(error_of(from_trtllm_tensors, {"temperature": math.inf}, VOCAB)) == \
        "temperature: must be a finite number, got inf"
    assert str(error_of(from_trtllm_tensors, {"temperature": math.nan}, VOCAB)) == \
        "temperature: must be a finite number, got nan"
    assert from_trtllm_tensors({"temperature": 3.0}, VOCAB).temperature == 0.0


VLLM_FLOAT_KEYS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


@pytest.mark.parametrize("key", VLLM_FLOAT_KEYS)
@pytest.mark.parametrize("raw", ["Infinity", "-Infinity", "NaN", '"inf"', '"nan"', '"-inf"'])
def test_vllm_non_finite_floats_are_refused_on_both_paths(key, raw):
    e = error_of(from_vllm_json, f'{{"{key}": {raw}}}', VOCAB)
    assert e.field == f"sampling_parameters.{key}" and "must be a finite number" in e.message
    e = error_of(from_request_parameters, f'{{"{key}": {raw}}}', VOCAB)
    assert e.field == f"sampling_parameters.{key}" and "must be a finite number" in e.message


def test_vllm_non_finite_logit_bias_is_refused():
    for raw in ("Infinity", "NaN", '"-inf"'):
        e = error_of(from_vllm_json, f'{{"logit_bias": {{"5": {raw}}}}}', VOCAB)
        assert e.field == "sampling_parameters.logit_bias" and "must be a finite number" in e.message


def test_the_engine_refuses_non_finite_floats_itself():
    """Entry points that build SamplingParams directly get the same rule."""
    assert set(FLOAT_FIELDS) == set(VLLM_FLOAT_KEYS)
    for name in FLOAT_FIELDS:
        for v in NON_FINITE:
            e = error_of(SamplingParams(**{name: v}).validate, VOCAB)
            assert (e.field, e.message) == (name, f"must be a finite number, got {v}")
    e = error_of(SamplingParams(logit_bias={3: math.inf}).validate, VOCAB)
    assert e.field == "logit_bias" and "must be a finite number" in e.message


# -- ensemble errors name the ensemble's tensors -----------------------------------------------------

def _ensemble_cases():
    floats = [math.inf, -math.inf, math.nan, 1e38, -1e38, -1.0, 0.0, 3.0, 1e-45]
    ints = [-(2**31), -1, 0, 1, 2**31 - 1]
    for name in trtllm.FLOAT_TENSORS:
        for v in floats:
            yield {name: v}
            yield {name: v, "top_k": 5}
    for name in trtllm.INT_TENSORS:
        for v in ([0, 1, 2**63, 2**64 - 1] if name in ("seed", "random_seed") else ints):
            yield {name: v}
            yield {name: v, "top_p": 0.5}
    yield {"stop_words": ["a", ""], "bad_words": ["b"]}
    yield {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[0-9]+"}
    yield {"guided_decoding_guide_type": "json"}


def test_what_preprocessing_accepts_the_llm_step_accepts():
    """Every ensemble input with good and bad values: preprocessing refuses it naming the tensor, or
    llm's parse of preprocessing's JSON (and the engine's rules) accepts it. Before this, an inf
    repetition_penalty (or an inf temperature with top_k) passed preprocessing and came back from
    llm as `sampling_parameters.repetition_penalty: must be finite`."""
    accepted = 0
    for values in _ensemble_cases():
        try:
            p = from_trtllm_tensors(dict(values), VOCAB)
        except InvalidRequestError as e:
            assert e.field in trtllm.FLOAT_TENSORS + trtllm.INT_TENSORS or e.field.startswith("guided"), (values, e)
            assert "sampling_parameters" not in str(e)
            continue
        q = from_pipeline_json(to_json(p))
        q.n = p.n
        q.validate(VOCAB)  # the engine's rules again, as add_request runs them
        accepted += 1
    assert accepted > 50


@pytest.mark.parametrize("raw, tensor", [
    ('{"temperature": Infinity}', "temperature"),
    ('{"repetition_penalty": "x"}', "repetition_penalty"),
    ('{"stop": 3}', "stop_words"),
    ('{"end_id": "x"}', "end_id"),
    ('{"structured_outputs": {"regex": 3}}', "guided_decoding_guide"),
])
def test_pipeline_json_errors_name_ensemble_tensors(raw, tensor):
    e = error_of(from_pipeline_json, raw)
    assert e.field == tensor and "sampling_parameters" not in str(e)


def test_pipeline_guide_errors_name_the_ensemble_tensor():
    p = from_trtllm_tensors({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[a-c]+"}, VOCAB)
    assert p.guide.field == "guided_decoding_guide"
    assert from_pipeline_json(to_json(p)).guide.field == "guided_decoding_guide"  # the engine names this one


# -- prompt longer than max_model_len ----------------------------------------------------------------

def test_a_prompt_alone_over_max_model_len_names_text_input_not_max_tokens():
    e = error_of(check_max_tokens, SamplingParams(max_tokens=8), 9000, 8192)
    assert e.field == "text_input"
    assert str(e).startswith("text_input: the prompt has 9000 tokens, more than max_model_len 8192")
    e = error_of(check_max_tokens, SamplingParams(), 8192, 8192)
    assert str(e).startswith("text_input: the prompt has 8192 tokens, as many as max_model_len 8192")
    # a prompt that fits but leaves too little room still names max_tokens
    e = error_of(check_max_tokens, SamplingParams(max_tokens=10), 8190, 8192)
    assert e.field == "sampling_parameters.max_tokens" and "8190" in str(e) and "8192" in str(e)
    check_prompt_length(8191, 8192)


def test_engine_field_names_reach_clients_as_the_triton_inputs_name_them():
    """The engine names fields in its own terms (prompt, prompt_token_ids, eos_token_ids); the
    contracts answer under their inputs' names, code and message kept."""
    for field, name in (("prompt", "text_input"), ("prompt_token_ids", "input_ids"), ("eos_token_ids", "end_id")):
        e = triton_error(InvalidRequestError(field, "bad", ErrorCode.PROMPT_TOO_LONG))
        assert (str(e), e.code) == (f"{name}: bad", ErrorCode.PROMPT_TOO_LONG)
    same = InvalidRequestError("max_tokens", "bad")
    assert triton_error(same) is same
    e = error_of(from_vllm_json, json.dumps({"end_id": [VOCAB]}), VOCAB)
    assert (e.field, e.code) == ("sampling_parameters.end_id", ErrorCode.INVALID_SAMPLING_PARAM)
    e = error_of(from_trtllm_tensors, {"end_id": VOCAB}, VOCAB)
    assert (e.field, e.code) == ("end_id", ErrorCode.INVALID_SAMPLING_PARAM)
    e = error_of(from_pipeline_json, json.dumps({"structured_outputs": {"regex": "(("}}))
    assert (e.field, e.code) == ("guided_decoding_guide", ErrorCode.INVALID_GUIDE)
    e = error_of(check_max_tokens, SamplingParams(max_tokens=8), 9000, 8192)
    assert e.code is ErrorCode.PROMPT_TOO_LONG


# -- the vLLM backend's streamed refusal -------------------------------------------------------------

def test_streamed_exclude_input_false_is_the_vllm_backends_exact_text():
    e = error_of(check_stream_prompt, True, False)
    assert str(e) == "Error generating stream: When streaming, `exclude_input_in_output` = False is not allowed."
    assert str(e) == STREAM_PROMPT_REFUSAL and e.field == "exclude_input_in_output"
    for stream, exclude in ((True, None), (True, True), (False, False), (False, None)):
        check_stream_prompt(stream, exclude)


# -- the request timeout, as Triton 2.51 delivers it ------------------------------------------------

class _Req:
    def __init__(self, timeout=0, parameters="{}"):
        self._t, self._p = timeout, parameters

    def timeout(self):
        return self._t

    def parameters(self):
        return self._p


def test_request_timeout_from_request_timeout_or_the_http_generate_parameter():
    assert timeout_us(_Req(2_000_000)) == 2_000_000 and timeout_seconds(_Req(2_000_000)) == 2.0
    # HTTP generate: request.timeout() stays 0, the value is a request parameter
    assert timeout_seconds(_Req(0, '{"timeout": 1500000, "temperature": 0}')) == 1.5
    assert timeout_seconds(_Req(0, {"timeout": "250000"})) == 0.25
    assert timeout_seconds(_Req(3_000_000, '{"timeout": 1}')) == 3.0  # the request's own wins
    assert timeout_seconds(_Req()) is None and timeout_seconds(_Req(0, '{"timeout": 0}')) is None
    for bad in ('{"timeout": -5}', '{"timeout": 1.5}', '{"timeout": "soon"}', '{"timeout": true}'):
        e = error_of(timeout_us, _Req(0, bad))
        assert e.field == "timeout" and "microseconds" in e.message


# -- config.pbtxt names ------------------------------------------------------------------------------

def _triton(params: dict) -> dict:
    return {"name": "llm", "parameters": {k: {"string_value": v} for k, v in params.items()}}


ARGS = {"model_name": "llm", "model_instance_name": "llm_0_0"}


def test_config_parameters_of_the_limits(caplog):
    cfg = engine_config_from_triton(_triton({"model_dir": "/m", "max_num_waiting": "64", "max_request_seconds": "2.5"}),
                                    ARGS)
    assert (cfg.max_num_waiting, cfg.max_request_seconds) == (64, 2.5)
    with caplog.at_level(logging.WARNING, logger="paddle_llm_engine.config"):
        cfg = engine_config_from_triton(_triton({"model_dir": "/m", "max_waiting_requests": "1024"}), ARGS)
    assert cfg.max_num_waiting == 1024 and "max_waiting_requests is deprecated" in caplog.text
    with pytest.raises(ValueError, match="sets both max_num_waiting and its deprecated alias max_waiting_requests"):
        engine_config_from_triton(_triton({"model_dir": "/m", "max_waiting_requests": "8", "max_num_waiting": "0"}),
                                  ARGS)
    with pytest.raises(ValueError, match="max_request_seconds must be a float"):
        engine_config_from_triton(_triton({"model_dir": "/m", "max_request_seconds": "soon"}), ARGS)
