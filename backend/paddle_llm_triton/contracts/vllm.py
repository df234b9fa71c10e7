"""The Triton vLLM-backend contract (model `llm`): `sampling_parameters` JSON -> SamplingParams.

`sampling_parameters` is a JSON object; clients written for Triton's vLLM backend often send
numbers as strings ({"temperature": "0.1"}), so numeric strings are converted, strictly. Unknown
keys and values of the wrong type raise InvalidRequestError naming `sampling_parameters.<key>`;
nothing is silently dropped or defaulted. The ranges of the values are the engine's own rules
(SamplingParams.validate, which the engine runs when the request is added): vLLM's semantics are
the engine's, so this contract adds none of its own beyond `n` / `best_of` being 1.
"""

from __future__ import annotations

import json
import math

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_triton.contracts import guided


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
    # guided decoding (contracts/guided.py): vLLM's GuidedDecodingParams under its old and new names
    "guided_decoding": (guided.from_vllm, "guide"),
    "structured_outputs": (guided.from_vllm, "guide"),
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
    if all(obj.get(k) is not None for k in guided.VLLM_GUIDE_KEYS):
        raise InvalidRequestError("sampling_parameters.guided_decoding",
                                  "send either guided_decoding or structured_outputs, not both")
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


def to_json(p: SamplingParams) -> str:
    """Serialize to the JSON `from_vllm_json` reads (used between the ensemble's steps)."""
    d = {}
    defaults = SamplingParams()
    for key, (_, attr) in _VLLM_KEYS.items():
        if attr is None:
            continue
        v = getattr(p, attr)
        if attr == "guide":
            if v is not None and key == "structured_outputs":
                d[key] = guided.to_vllm(v)
            continue
        if v != getattr(defaults, attr):
            d["end_id" if attr == "eos_token_ids" else key] = v
    return json.dumps(d)
