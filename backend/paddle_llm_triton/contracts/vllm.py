"""The Triton vLLM-backend contract (model `llm`): `sampling_parameters` JSON, or the request's
Triton parameters, -> SamplingParams.

`sampling_parameters` is a JSON object; clients written for Triton's vLLM backend often send
numbers as strings ({"temperature": "0.1"}), so numeric strings are converted, strictly. Without
that tensor the sampling parameters are the request's Triton parameters (`request.parameters()`,
what Triton's HTTP generate endpoint makes of `"parameters": {...}` and of other JSON keys that are
not inputs; gRPC `parameters=`), read by the same rules; when the tensor is sent, the request
parameters are not read at all (the vLLM backend's rule). Among request parameters, names of llm's
BOOL inputs (stream, exclude_input_in_output, return_*) are those inputs (INPUT_FLAGS) and Triton's
own names (TRITON_PARAMETERS) are skipped.

Every failure is an InvalidRequestError naming `sampling_parameters.<key>`, for unknown keys, values
of the wrong type and values out of range alike (one form, whichever way the key came). Known vLLM
SamplingParams keys that this server does not implement (UNSUPPORTED_VLLM_KEYS) say so; any other
unknown key is "unknown key". The ranges are the engine's own rules: vLLM's semantics are the
engine's, so this contract adds none of its own beyond `n` / `best_of` being 1. The engine checks
them once, when the request is submitted (LLMEngine.check_request), and contract_error() renames
the field it names into this contract's words; given a vocabulary size, from_vllm_json and
from_request_parameters run the same rules at parse time (a client-side check without an engine).
"""

from __future__ import annotations

import json
import math

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.sampling_params import SamplingParams, check_lengths
from paddle_llm_triton.contracts import guided
from paddle_llm_triton.contracts.values import parse_json, to_bool, triton_error


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
        raise InvalidRequestError(field, f"must be a finite number, got {v!r}")
    return f


def _to_str_list(field: str, v) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise InvalidRequestError(field, f"expected a string or a list of strings, got {v!r}")


def _to_str(field: str, v) -> str:
    if not isinstance(v, str):
        raise InvalidRequestError(field, f"expected a string, got {v!r}")
    return v


def _json_string(field: str, v, kind: type):
    """A request parameter can only be a scalar: a list or object arrives as a JSON string."""
    if isinstance(v, str) and v.strip()[:1] in ("[", "{"):
        v = parse_json(field, v)
        if not isinstance(v, kind):
            raise InvalidRequestError(field, f"expected a JSON {'list' if kind is list else 'object'}")
    return v


def _to_int_list(field: str, v) -> list[int]:
    v = _json_string(field, v, list)
    if isinstance(v, list):
        return [_to_int(field, x) for x in v]
    return [_to_int(field, v)]


def _to_logit_bias(field: str, v) -> dict[int, float]:
    """{token id: bias} (ids may be strings: JSON object keys are)."""
    v = _json_string(field, v, dict)
    if not isinstance(v, dict):
        raise InvalidRequestError(field, f"expected an object {{token id: bias}}, got {v!r}")
    return {_to_int(field, k): _to_float(field, b) for k, b in v.items()}


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
    "ignore_eos": (to_bool, "ignore_eos"),
    "seed": (_to_int, "seed"),
    "presence_penalty": (_to_float, "presence_penalty"),
    "frequency_penalty": (_to_float, "frequency_penalty"),
    "repetition_penalty": (_to_float, "repetition_penalty"),
    "skip_special_tokens": (to_bool, "skip_special_tokens"),
    "logprobs": (_to_int, "logprobs"),
    "bad_words": (_to_str_list, "bad_words"),
    # extension: replaces the model's EOS ids (TensorRT-LLM's end_id); vLLM has no equivalent
    "end_id": (_to_int_list, "eos_token_ids"),
    "n": (_to_int, "n"),  # 1..64 (the engine's rule); the vLLM backend's response form (vllm_request.py)
    "best_of": (_must_be_one, None),
    # guided decoding (contracts/guided.py): vLLM's GuidedDecodingParams under its old and new names
    "guided_decoding": (guided.from_vllm, "guide"),
    "structured_outputs": (guided.from_vllm, "guide"),
    "include_stop_str_in_output": (to_bool, "include_stop_str_in_output"),
    "spaces_between_special_tokens": (to_bool, "spaces_between_special_tokens"),
    "logit_bias": (_to_logit_bias, "logit_bias"),
    "allowed_token_ids": (_to_int_list, "allowed_token_ids"),
    "truncate_prompt_tokens": (_to_int, "truncate_prompt_tokens"),
    # thinking models (paddle_llm_engine/reasoning/): one budget under FastDeploy's and vLLM's names,
    # and the per-request parser (an extension: "none" or a family; what the OpenAI frontend sends)
    "reasoning_max_tokens": (_to_int, "reasoning_max_tokens"),
    "thinking_token_budget": (_to_int, "reasoning_max_tokens"),
    "reasoning_parser": (_to_str, "reasoning_parser"),
    # vLLM's per-request scheduling priority (acts under scheduling_policy "priority")
    "priority": (_to_int, "priority"),
    # the vLLM backend's LoRA adapter (a name of multi_lora.json, lora_modules or a runtime load); the
    # engine refuses a name it has not loaded, and any name when enable_lora is 0
    "lora_name": (_to_str, "lora_name"),
}
# keys that are two names of one parameter: both given with different values is an error naming both
SYNONYMS = (("reasoning_max_tokens", "thinking_token_budget"),)

# vLLM SamplingParams keys not implemented here: key -> (the value that changes nothing, accepted; or
# _NO_NOOP) and why. Refused with that reason, not as unknown.
_NO_NOOP = object()
UNSUPPORTED_VLLM_KEYS = {
    "prompt_logprobs": (_NO_NOOP, "prompt logprobs are not computed (the model scores the last position only)"),
    "detokenize": (True, "the output is always detokenized"),
    "logits_processors": (_NO_NOOP, "custom logits processors cannot be sent to this server"),
    "output_kind": (_NO_NOOP, "the response form follows the `stream` input"),
    "extra_args": (_NO_NOOP, "no extension reads them"),
    "use_beam_search": (False, "beam search is not implemented"),
    "length_penalty": (1.0, "it acts in beam search only, which is not implemented"),
    "early_stopping": (False, "it acts in beam search only, which is not implemented"),
    "flat_logprobs": (_NO_NOOP, "logprobs are returned in the vLLM backend's per-token form"),
    "skip_reading_prefix_cache": (_NO_NOOP, "the prefix cache is a model setting (enable_prefix_caching)"),
}

# llm's BOOL inputs, also read from request parameters when the tensor is absent (Triton's HTTP
# generate endpoint already turns parameters with these names into the inputs)
INPUT_FLAGS = ("stream", "exclude_input_in_output", "return_finish_reason", "return_cumulative_logprob",
               "return_logprobs", "return_num_input_tokens", "return_num_output_tokens", "return_reasoning",
               "return_num_cached_tokens")
# request parameters that are Triton's, not sampling parameters (also every "triton_" name)
TRITON_PARAMETERS = frozenset({"priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
                               "binary_data_output", "binary_data_size"})


def from_vllm_json(text: str | bytes | None, vocab_size: int | None = None) -> SamplingParams:
    """Parse the vLLM backend's `sampling_parameters` JSON. Empty / None -> all defaults.
    vocab_size: also check the ranges (SamplingParams.validate), naming sampling_parameters.<key>."""
    p = SamplingParams()
    if text is None:
        return p
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if not text.strip():
        return p
    obj = parse_json("sampling_parameters", text)
    if not isinstance(obj, dict):
        raise InvalidRequestError("sampling_parameters", "must be a JSON object")
    return _from_dict(obj, vocab_size)


def from_request_parameters(raw: str | dict | None, vocab_size: int | None = None
                            ) -> tuple[SamplingParams, dict[str, bool]]:
    """The request's Triton parameters (`request.parameters()` JSON) -> (params, input flags).

    Sampling keys as in `sampling_parameters` (same conversions, same errors); a `sampling_parameters`
    parameter holding the JSON is used as that input would be; names in INPUT_FLAGS come back as
    flags {name: bool}; Triton's own parameters are skipped."""
    obj = parse_json("parameters", raw) if isinstance(raw, (str, bytes)) and raw.strip() else (raw or {})
    flags: dict[str, bool] = {}
    keys: dict = {}
    for key, value in obj.items():
        if key in INPUT_FLAGS:
            flags[key] = to_bool(key, value)
        elif key in TRITON_PARAMETERS or key.startswith("triton_"):
            continue
        else:
            keys[key] = value
    if "sampling_parameters" in keys:
        sp = keys["sampling_parameters"]
        return from_vllm_json(sp if isinstance(sp, str) else json.dumps(sp), vocab_size), flags
    return _from_dict(keys, vocab_size), flags


def _from_dict(obj: dict, vocab_size: int | None) -> SamplingParams:
    p = SamplingParams()
    if all(obj.get(k) is not None for k in guided.VLLM_GUIDE_KEYS):
        raise InvalidRequestError("sampling_parameters.guided_decoding",
                                  "send either guided_decoding or structured_outputs, not both")
    for a, b in SYNONYMS:
        if obj.get(a) is not None and obj.get(b) is not None and _to_int(f"sampling_parameters.{a}", obj[a]) != \
                _to_int(f"sampling_parameters.{b}", obj[b]):
            raise InvalidRequestError(f"sampling_parameters.{a}", f"{a} ({obj[a]}) and {b} ({obj[b]}) are one "
                                                                  "budget under two names; both given with different values")
    for key, value in obj.items():
        spec = _VLLM_KEYS.get(key)
        field = f"sampling_parameters.{key}"
        if spec is None:
            if key in UNSUPPORTED_VLLM_KEYS:
                noop, why = UNSUPPORTED_VLLM_KEYS[key]
                if value is None or (noop is not _NO_NOOP and _same(noop, value)):
                    continue
                raise InvalidRequestError(field, f"a vLLM sampling parameter that this server does not support: {why}")
            raise InvalidRequestError(field, f"unknown key (supported: {', '.join(sorted(_VLLM_KEYS))}; vLLM "
                                             f"parameters not supported here: {', '.join(sorted(UNSUPPORTED_VLLM_KEYS))})")
        if value is None:
            continue  # JSON null = not set, as in vLLM
        conv, attr = spec
        v = conv(field, value)
        if attr is not None:
            setattr(p, attr, v)
    if vocab_size is not None:
        try:
            p.validate(vocab_size)
        except InvalidRequestError as e:  # the engine's rule, under this contract's name for the key
            raise contract_error(e) from None
    return p


# this contract's inputs (not sampling_parameters keys) among the fields of triton_error
_INPUT_FIELDS = ("text_input", "input_ids")


def contract_error(e: InvalidRequestError) -> InvalidRequestError:
    """An engine InvalidRequestError under this contract's name for its field: the prompt is
    text_input (triton_error), a SamplingParams field becomes sampling_parameters.<key> (end_id,
    max_tokens, top_p, ...); a field already named that way (a guide's, a parse error's) and a
    verbatim refusal stay. The code is kept."""
    if isinstance(e, _VerbatimInvalidRequest):
        return e
    e = triton_error(e)
    if e.field in _INPUT_FIELDS or e.field.startswith("sampling_parameters"):
        return e
    return InvalidRequestError(f"sampling_parameters.{e.field}", e.message, e.code)


def _same(noop, value) -> bool:
    """value (as a client sends it: 1, "1.0", "false", ...) equals the no-op value."""
    try:
        if isinstance(noop, bool):
            return to_bool("", value) == noop
        return _to_float("", value) == noop
    except InvalidRequestError:
        return False


# The Triton vLLM backend's exact refusal of exclude_input_in_output false on a stream (its
# src/utils/request.py raises the ValueError "When streaming, `exclude_input_in_output` = False is
# not allowed." and src/model.py sends it as "Error generating stream: {e}"); its CI compares the
# whole message, so it is sent verbatim (as INVALID_ARG here).
STREAM_PROMPT_REFUSAL = "Error generating stream: When streaming, `exclude_input_in_output` = False is not allowed."


class _VerbatimInvalidRequest(InvalidRequestError):
    """An InvalidRequestError whose message is exactly `text` (another server's wording), not
    "<field>: <message>"; `field` still names the field."""

    def __init__(self, field: str, text: str):
        super().__init__(field, text)
        self.args = (text,)


def check_stream_prompt(stream: bool, exclude_input_in_output: bool | None) -> None:
    """A stream never repeats the prompt: exclude_input_in_output false (sent explicitly) on a
    stream is refused with the vLLM backend's own text (STREAM_PROMPT_REFUSAL); absent is fine."""
    if stream and exclude_input_in_output is False:
        raise _VerbatimInvalidRequest("exclude_input_in_output", STREAM_PROMPT_REFUSAL)


def check_max_tokens(p: SamplingParams, num_prompt_tokens: int, max_model_len: int) -> None:
    """The engine's length rules (sampling_params.check_lengths) under this contract's names: a
    prompt that alone leaves no room for output names text_input with its length and the limit;
    otherwise prompt + max_tokens <= max_model_len, named sampling_parameters.max_tokens."""
    try:
        check_lengths(num_prompt_tokens, p.max_tokens, max_model_len)
    except InvalidRequestError as e:
        raise contract_error(e) from None


def to_json(p: SamplingParams) -> str:
    """Serialize to the JSON `from_vllm_json` reads (used between the ensemble's steps)."""
    d = {}
    defaults = SamplingParams()
    synonyms = {b for _, b in SYNONYMS}
    for key, (_, attr) in _VLLM_KEYS.items():
        if attr is None or key in synonyms:
            continue
        v = getattr(p, attr)
        if attr == "guide":
            if v is not None and key == "structured_outputs":
                d[key] = guided.to_vllm(v)
            continue
        if v != getattr(defaults, attr):
            d["end_id" if attr == "eos_token_ids" else key] = v
    return json.dumps(d)
