"""The Triton TensorRT-LLM ensemble contract (model `ensemble`): one tensor per parameter
(max_tokens, top_k, ...), already reduced to Python scalars / lists -> SamplingParams.

Where TensorRT-LLM's rules differ from the engine's (SamplingParams.validate, the vLLM rules), the
difference is written here, once: top_p 0 is allowed and means "no nucleus filter"; top_k has no
-1 (0 is off); without top_k and top_p (or both 0) decoding is greedy whatever the temperature;
beam search parameters only take their no-op values. Every other range is the engine's own rule,
checked on the client's values before the greedy default rewrites the temperature.
"""

from __future__ import annotations

import dataclasses
import math

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.sampling_params import MAX_SEQUENCES, SamplingParams
from paddle_llm_triton import tensors as T
from paddle_llm_triton.contracts import guided
from paddle_llm_triton.contracts.values import triton_error
from paddle_llm_triton.contracts.vllm import from_vllm_json

INT_TENSORS = ("max_tokens", "top_k", "end_id", "pad_id", "min_tokens", "min_length", "beam_width",
               "num_return_sequences", "seed", "random_seed", "reasoning_max_tokens", "thinking_token_budget")
FLOAT_TENSORS = ("top_p", "temperature", "repetition_penalty", "presence_penalty", "frequency_penalty",
                 "length_penalty")
STRING_LIST_TENSORS = ("stop_words", "bad_words")
STRING_TENSORS = ("guided_decoding_guide_type", "guided_decoding_guide")  # guided decoding (contracts/guided.py)

# tensor -> (SamplingParams attribute, type); the pairs seed / random_seed and min_tokens /
# min_length are TensorRT-LLM's two names of one parameter
_SCALARS = (
    ("max_tokens", "max_tokens", int), ("temperature", "temperature", float), ("top_k", "top_k", int),
    ("top_p", "top_p", float), ("seed", "seed", int), ("random_seed", "seed", int),
    ("min_tokens", "min_tokens", int), ("min_length", "min_tokens", int),
    ("repetition_penalty", "repetition_penalty", float), ("presence_penalty", "presence_penalty", float),
    ("frequency_penalty", "frequency_penalty", float),
    # thinking models: FastDeploy's and vLLM's names of one budget (extensions of this contract)
    ("reasoning_max_tokens", "reasoning_max_tokens", int), ("thinking_token_budget", "reasoning_max_tokens", int),
)


def tensor_values(request) -> dict:
    """The parameter tensors a request carries -> {name: Python value} (absent ones left out; empty
    stop_words / bad_words too). Raises InvalidRequestError naming a tensor of the wrong shape or type."""
    values = {}
    for names, read in ((INT_TENSORS, T.get_int), (FLOAT_TENSORS, T.get_float),
                        (STRING_LIST_TENSORS, T.get_str_list), (STRING_TENSORS, T.get_str)):
        for name in names:
            v = read(request, name)
            if v is not None and v != []:
                values[name] = v
    return values


def from_trtllm_tensors(values: dict, vocab_size: int) -> SamplingParams:
    """Map TensorRT-LLM ensemble inputs (already reduced to Python scalars / lists) to validated params.

    Accepted keys: max_tokens, temperature, top_k, top_p, seed / random_seed, min_tokens /
    min_length, repetition_penalty, presence_penalty, frequency_penalty, end_id, stop_words,
    bad_words, reasoning_max_tokens / thinking_token_budget (thinking models' budget), beam_width (1 only), num_return_sequences (1..MAX_SEQUENCES, sets n), length_penalty (1.0 only: it only
    acts in beam search), guided_decoding_guide_type / guided_decoding_guide (contracts/guided.py).
    vocab_size: the model's (config.json), bounds end_id. Raises InvalidRequestError naming the tensor;
    every float tensor must be a finite number (checked first: the greedy default below would hide a
    temperature of inf).
    """
    for name in FLOAT_TENSORS:
        if name in values and not math.isfinite(float(values[name])):
            raise InvalidRequestError(name, f"must be a finite number, got {float(values[name])}")
    if "beam_width" in values and int(values["beam_width"]) != 1:
        raise InvalidRequestError("beam_width", f"only 1 is supported (beam search is not implemented), "
                                                f"got {values['beam_width']}")
    if "num_return_sequences" in values and not 1 <= int(values["num_return_sequences"]) <= MAX_SEQUENCES:
        raise InvalidRequestError("num_return_sequences", f"must be in [1, {MAX_SEQUENCES}], "
                                                          f"got {values['num_return_sequences']}")
    if "length_penalty" in values and float(values["length_penalty"]) != 1.0:
        raise InvalidRequestError("length_penalty", "only 1.0 is supported (it applies to beam search only)")
    if "seed" in values and "random_seed" in values and int(values["seed"]) != int(values["random_seed"]):
        raise InvalidRequestError("seed", "seed and random_seed both given with different values")
    if "min_tokens" in values and "min_length" in values and int(values["min_tokens"]) != int(values["min_length"]):
        raise InvalidRequestError("min_tokens", "min_tokens and min_length both given with different values")
    if ("reasoning_max_tokens" in values and "thinking_token_budget" in values
            and int(values["reasoning_max_tokens"]) != int(values["thinking_token_budget"])):
        raise InvalidRequestError("reasoning_max_tokens", f"reasoning_max_tokens ({values['reasoning_max_tokens']}) and "
                                                          f"thinking_token_budget ({values['thinking_token_budget']}) "
                                                          "are one budget under two names; both given with different values")
    p = SamplingParams(n=int(values.get("num_return_sequences", 1)))
    for key, attr, conv in _SCALARS:
        if key in values:
            setattr(p, attr, conv(values[key]))
    if "end_id" in values:
        p.eos_token_ids = [int(values["end_id"])]
    if values.get("stop_words"):
        p.stop = [s for s in values["stop_words"] if s]
    if values.get("bad_words"):
        p.bad_words = [s for s in values["bad_words"] if s]
    p.guide = guided.from_trtllm(values.get("guided_decoding_guide_type"), values.get("guided_decoding_guide"))
    if p.top_k < 0:
        raise InvalidRequestError("top_k", f"must be >= 0 (0 = off), got {p.top_k}")
    if not (0.0 <= p.top_p <= 1.0):
        raise InvalidRequestError("top_p", f"must be in [0, 1] (0 = off), got {p.top_p}")
    if p.top_p == 0.0:
        p.top_p = 1.0  # no nucleus filter, in the engine's terms
    try:
        p.validate(vocab_size)
    except InvalidRequestError as e:  # the engine's rule, under the tensor's name (eos_token_ids: end_id)
        raise triton_error(e) from None
    if values.get("top_k", 0) == 0 and values.get("top_p", 0.0) == 0.0:
        p.temperature = 0.0  # TensorRT-LLM decodes greedily without top_k and top_p
    return p


# sampling_parameters keys of the pipeline's JSON (contracts/vllm.py to_json) -> the ensemble tensor
# they came from; the keys not listed have the tensor's name
_TENSOR_OF_KEY = {"stop": "stop_words", "structured_outputs": "guided_decoding_guide", "n": "num_return_sequences"}


def from_pipeline_json(text: str | bytes | None) -> SamplingParams:
    """The ensemble's validated parameters as `llm` receives them from its pipeline (preprocessing's
    SAMPLING_PARAMETERS, vLLM-style JSON) -> SamplingParams. Any error, here or later in the engine
    (a guide's compile errors name guide.field), names the ensemble's own tensor, never
    `sampling_parameters.<key>`: the ensemble's clients never sent that input."""
    try:
        p = from_vllm_json(text, None)
    except InvalidRequestError as e:
        key = e.field.split(".")[1] if e.field.startswith("sampling_parameters.") else e.field
        raise InvalidRequestError(_TENSOR_OF_KEY.get(key, key), e.message, e.code) from None
    if p.guide is not None:
        p.guide = dataclasses.replace(p.guide, field="guided_decoding_guide")
    return p
