"""The Triton TensorRT-LLM ensemble contract (model `ensemble`): one tensor per parameter
(max_tokens, top_k, ...), already reduced to Python scalars / lists -> SamplingParams."""

from __future__ import annotations

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.sampling_params import SamplingParams


def from_trtllm_tensors(values: dict) -> SamplingParams:
    """Map TensorRT-LLM ensemble inputs (already reduced to Python scalars / lists) to params.

    Defaults follow TensorRT-LLM, not vLLM: without top_k and top_p (or both 0) decoding is greedy;
    top_p 0 means no nucleus filter. Accepted keys: max_tokens, temperature, top_k, top_p, seed / random_seed, min_tokens /
    min_length, repetition_penalty, presence_penalty, frequency_penalty, end_id, stop_words,
    beam_width (1 only), num_return_sequences (1 only), length_penalty (1.0 only: it only acts in
    beam search). Raises InvalidRequestError naming the tensor.
    """
    p = SamplingParams()
    if "beam_width" in values and int(values["beam_width"]) != 1:
        raise InvalidRequestError("beam_width", f"only 1 is supported (beam search is not implemented), "
                                                f"got {values['beam_width']}")
    if "num_return_sequences" in values and int(values["num_return_sequences"]) != 1:
        raise InvalidRequestError("num_return_sequences", f"only 1 is supported, got {values['num_return_sequences']}")
    if "length_penalty" in values and float(values["length_penalty"]) != 1.0:
        raise InvalidRequestError("length_penalty", "only 1.0 is supported (it applies to beam search only)")
    if "seed" in values and "random_seed" in values and int(values["seed"]) != int(values["random_seed"]):
        raise InvalidRequestError("seed", "seed and random_seed both given with different values")
    if "min_tokens" in values and "min_length" in values and int(values["min_tokens"]) != int(values["min_length"]):
        raise InvalidRequestError("min_tokens", "min_tokens and min_length both given with different values")
    for key, attr, conv in (
        ("max_tokens", "max_tokens", int), ("temperature", "temperature", float), ("top_k", "top_k", int),
        ("top_p", "top_p", float), ("seed", "seed", int), ("random_seed", "seed", int),
        ("min_tokens", "min_tokens", int), ("min_length", "min_tokens", int),
        ("repetition_penalty", "repetition_penalty", float), ("presence_penalty", "presence_penalty", float),
        ("frequency_penalty", "frequency_penalty", float),
    ):
        if key in values:
            setattr(p, attr, conv(values[key]))
    p.validate_ranges_before_defaults()
    # TensorRT-LLM semantics: top_p 0 means "no nucleus filter", and with neither top_k nor top_p
    # set the runtime decodes greedily whatever the temperature.
    if p.top_p == 0.0:
        p.top_p = 1.0
    if values.get("top_k", 0) == 0 and values.get("top_p", 0.0) == 0.0:
        p.temperature = 0.0
    if "end_id" in values:
        p.eos_token_ids = [int(values["end_id"])]
    if values.get("stop_words"):
        p.stop = [s for s in values["stop_words"] if s]
    if values.get("bad_words"):
        p.bad_words = [s for s in values["bad_words"] if s]
    return p
