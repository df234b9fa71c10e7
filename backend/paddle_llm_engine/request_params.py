"""Build SamplingParams from the two client contracts the Triton models accept.

- vLLM backend: `sampling_parameters` is a JSON object; clients written for Triton's vLLM backend
  often send numbers as strings ({"temperature": "0.1"}), so numeric strings are converted, strictly.
- TensorRT-LLM ensemble: one tensor per parameter (max_tokens, top_k, ...), already scalars here.
Unknown keys and values of the wrong type raise InvalidRequestError naming the field; nothing is
silently dropped or defaulted.
"""

from __future__ import annotations

import json
import math

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.sampling_params import SamplingParams


def _to_int(field: str, v) -> int:
    if isinstance(v, bool):
        raise InvalidRequestError(field, f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
    raise InvalidRequestError(field, f"expected an integer, got {v!r}")


def _to_float(field: str, v) -> float:
    if isinstance(v, bool):
        raise InvalidRequestError(field, f"expected a number, got {v!r}")
    if isinstance(v, (int, float)):
        f = float(v)
    elif isinstance(v, str):
        try:
            f = float(v.strip())
        except ValueError:
            raise InvalidRequestError(field, f"expected a number, got {v!r}") from None
    else:
        raise InvalidRequestError(field, f"expected a number, got {v!r}")
    if not math.isfinite(f):
        raise InvalidRequestError(field, f"must be finite, got {v!r}")
    return f


def _to_bool(field: str, v) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise InvalidRequestError(field, f"expected true or false, got {v!r}")


def _to_str_list(field: str, v) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise InvalidRequestError(field, f"expected a string or a list of strings, got {v!r}")


def _to_int_list(field: str, v) -> list[int]:
    if isinstance(v, list):
        return [_to_int(field, x) for x in v]
    return [_to_int(field, v)]


def _must_be_one(field: str, v) -> int:
    n = _to_int(field, v)
    if n != 1:
        raise InvalidRequestError(field, f"only 1 is supported, got {n}")
    return n


# key -> (converter, SamplingParams attribute or None when only validated)
_VLLM_KEYS = {
    "temperature": (_to_float, "temperature"),
    "top_p": (_to_float, "top_p"),
    "top_k": (_to_int, "top_k"),
    "min_p": (_to_float, "min_p"),
    "max_tokens": (_to_int, "max_tokens"),
    "min_tokens": (_to_int, "min_tokens"),
    "stop": (_to_str_list, "stop"),
    "stop_token_ids": (_to_int_list, "stop_token_ids"),
    "ignore_eos": (_to_bool, "ignore_eos"),
    "seed": (_to_int, "seed"),
    "presence_penalty": (_to_float, "presence_penalty"),
    "frequency_penalty": (_to_float, "frequency_penalty"),
    "repetition_penalty": (_to_float, "repetition_penalty"),
    "skip_special_tokens": (_to_bool, "skip_special_tokens"),
    "logprobs": (_to_int, "logprobs"),
    "bad_words": (_to_str_list, "bad_words"),
    # extension: replaces the model's EOS ids (TensorRT-LLM's end_id); vLLM has no equivalent
    "end_id": (_to_int_list, "eos_token_ids"),
    "n": (_must_be_one, None),
    "best_of": (_must_be_one, None),
}


def from_vllm_json(text: str | bytes | None) -> SamplingParams:
    """Parse the vLLM backend's `sampling_parameters` JSON. Empty / None -> all defaults."""
    p = SamplingParams()
    if text is None:
        return p
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if not text.strip():
        return p
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequestError("sampling_parameters", f"not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise InvalidRequestError("sampling_parameters", "must be a JSON object")
    for key, value in obj.items():
        spec = _VLLM_KEYS.get(key)
        field = f"sampling_parameters.{key}"
        if spec is None:
            raise InvalidRequestError(field, f"unknown key (supported: {', '.join(sorted(_VLLM_KEYS))})")
        if value is None:
            continue  # JSON null = not set, as in vLLM
        conv, attr = spec
        v = conv(field, value)
        if attr is not None:
            setattr(p, attr, v)
    return p


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


def to_json(p: SamplingParams) -> str:
    """Serialize to the JSON `from_vllm_json` reads (used between the ensemble's steps)."""
    d = {}
    defaults = SamplingParams()
    for key, (_, attr) in _VLLM_KEYS.items():
        if attr is None:
            continue
        v = getattr(p, attr)
        if v != getattr(defaults, attr):
            d["end_id" if attr == "eos_token_ids" else key] = v
    return json.dumps(d)
