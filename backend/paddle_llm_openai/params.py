"""OpenAI request parameters -> `llm`'s `sampling_parameters` (the vLLM backend's JSON keys).

`sampling(req, chat, guide)` returns (sampling_parameters dict, names) where names maps llm's field
names back to this request's parameters for error messages (errors.to_openai_param): e.g.
"sampling_parameters.max_tokens" -> "max_completion_tokens" when that is what the client sent,
"sampling_parameters.logprobs" -> "top_logprobs" (chat), "sampling_parameters.structured_outputs"
-> "response_format", "text_input" -> "messages" / "prompt".

Value ranges are `llm`'s (the engine's own rules; a bad value comes back as INVALID_ARG naming the
key, mapped to 400 naming the parameter); only OpenAI-only rules are checked here (n, logprobs,
top_logprobs, the refused and the ignored fields, and OpenAI's narrower ranges: temperature in
[0, 2], completions logprobs in [0, 5]). n > 1: `llm` takes n = 1 only, so the endpoints
send n requests; with a seed, sequence i gets seed + i (sequence 0 is the n = 1 answer).
"""

from __future__ import annotations

from typing import Any

from paddle_llm_openai.errors import bad_param
from paddle_llm_openai.reasoning import budget as reasoning_budget

MAX_N = 16  # sequences per request (each is one `llm` request; more is better sent as separate requests)
MAX_LOGPROBS = 20  # llm's range for `logprobs` (vLLM's too); OpenAI's for chat top_logprobs
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's range for /v1/completions `logprobs`
MAX_TEMPERATURE = 2.0  # OpenAI's range (llm itself takes any finite temperature >= 0)
SEED_LIMIT = 2 ** 64

# field -> why it is refused (when set to anything but null / its no-op value, see _NOOP)
REFUSED = {
    "functions": "deprecated by OpenAI: send `tools`",
    "function_call": "deprecated by OpenAI: send `tool_choice`",
    "audio": "audio output is not supported (text models)",
    "modalities": "only [\"text\"] is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "verbosity": "the served models have no verbosity setting",
    "suffix": "insertion (fill-in-the-middle) is not supported",
    "best_of": "only 1 (or equal to n: every sequence is returned) is supported",
}
_NOOP = {"modalities": (["text"],)}
# accepted and ignored (no effect here; `strict`: schemas are always closed, strict or not)
IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key",
           "safety_identifier", "stream_options.include_obfuscation", "stream_options.continuous_usage_stats",
           "response_format.json_schema.strict")


def check_stream_options(req) -> None:
    """stream_options only with stream: true (OpenAI's rule)."""
    if req.stream_options is not None and not req.stream:
        raise bad_param("stream_options", "only allowed when stream is true")


def check_refused(req) -> None:
    """400 naming the first refused field that is set (null and no-op values pass); stream_options
    without stream."""
    check_stream_options(req)
    for name, why in REFUSED.items():
        v = getattr(req, name, None)
        if v is None or v in _NOOP.get(name, ()):
            continue
        if name == "best_of" and (v == 1 or v == (req.n or 1)):
            continue
        raise bad_param(name, f"not supported: {why}")


def check_n(req) -> int:
    n = 1 if req.n is None else req.n
    if not 1 <= n <= MAX_N:
        raise bad_param("n", f"must be between 1 and {MAX_N}, got {n}")
    return n


def seeds(seed: int | None, n: int) -> list[int | None]:
    """Per-sequence seeds: seed + i (None: each sequence draws its own fresh seed in the engine)."""
    if seed is None:
        return [None] * n
    if not 0 <= seed < SEED_LIMIT or seed + n - 1 >= SEED_LIMIT:
        raise bad_param("seed", f"must be in [0, 2^64 - n), got {seed}")
    return [seed + i for i in range(n)]


def response_format_guide(rf: dict | None) -> dict | None:
    """OpenAI response_format -> vLLM `structured_outputs` (None: unconstrained).
    {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "json_schema": {"name",
    "schema", "strict", "description"}}; the schema is compiled by llm (a bad one is 400 naming
    response_format)."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or "type" not in rf:
        raise bad_param("response_format", "expected an object with a `type`")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad_param("response_format.json_schema", "expected an object with `name` and `schema`")
        schema = js.get("schema")
        if schema is None:
            schema = {"type": "object"}  # OpenAI: schema is optional
        if not isinstance(schema, dict):
            raise bad_param("response_format.json_schema.schema", "expected a JSON schema object")
        return {"json": schema}
    raise bad_param("response_format.type", f"expected text, json_object or json_schema, got {kind!r}")


def response_format_schema(rf: dict | None) -> dict | None:
    """The JSON schema an answer must follow under response_format (json_object: any object, bounded
    as `llm` bounds it, paddle_llm_structured.any_json), or None (text / absent). For the tools'
    "auto" grammar (tools.guide_for); 400s as response_format_guide."""
    from paddle_llm_structured.any_json import any_json_schema

    guide = response_format_guide(rf)
    if guide is None:
        return None
    return guide["json"] if "json" in guide else any_json_schema()


def sampling(req, chat: bool, guide: dict | None = None, guide_param: str = "response_format"
             ) -> tuple[dict[str, Any], dict[str, str]]:
    """The request's `sampling_parameters` (without seed; see seeds()) and the field-name map.
    guide: vLLM `structured_outputs` contents (response_format or a forced tool call)."""
    sp: dict[str, Any] = {}
    names = {"text_input": "messages" if chat else "prompt",
             "sampling_parameters.structured_outputs": guide_param}
    max_tokens = req.max_tokens
    if chat and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
        names["sampling_parameters.max_tokens"] = "max_completion_tokens"
    if max_tokens is not None:
        sp["max_tokens"] = max_tokens
    if req.temperature is not None and not 0 <= req.temperature <= MAX_TEMPERATURE:
        raise bad_param("temperature", f"must be between 0 and {MAX_TEMPERATURE:g}, got {req.temperature}")
    for key in ("temperature", "top_p", "top_k", "min_p", "min_tokens", "ignore_eos", "presence_penalty",
                "frequency_penalty", "repetition_penalty", "skip_special_tokens", "stop_token_ids",
                "include_stop_str_in_output", "priority"):
        v = getattr(req, key)
        if v is not None:
            sp[key] = v
    if req.stop is not None and req.stop != []:
        sp["stop"] = req.stop
    if req.logit_bias:
        sp["logit_bias"] = req.logit_bias
    if chat:
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_param("top_logprobs", "needs logprobs: true")
        if req.logprobs:
            k = req.top_logprobs or 0
            if not 0 <= k <= MAX_LOGPROBS:
                raise bad_param("top_logprobs", f"must be between 0 and {MAX_LOGPROBS}, got {k}")
            sp["logprobs"] = k
            names["sampling_parameters.logprobs"] = "top_logprobs"
    elif req.logprobs is not None:
        if not 0 <= req.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise bad_param("logprobs", f"must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {req.logprobs}")
        if req.echo:
            raise bad_param("logprobs", "not supported with echo: prompt logprobs are not computed")
        sp["logprobs"] = req.logprobs
    if guide is not None:
        sp["structured_outputs"] = guide
    n, param = reasoning_budget(req)
    if n is not None:  # chat adds reasoning_effort on top (reasoning.apply)
        sp["reasoning_max_tokens"] = n
        names["sampling_parameters.reasoning_max_tokens"] = param
    return sp, names


def add_lora(sp: dict, names: dict, lora: str | None) -> None:
    """A request whose `model` is a LoRA adapter (lora.py) runs with it: llm's lora_name; llm's
    errors about it name `model` (errors.classify answers an adapter unloaded meanwhile with 404)."""
    names["sampling_parameters.lora_name"] = "model"
    if lora is not None:
        sp["lora_name"] = lora


def check_model(served: list[str], name: str) -> str:
    """404 (OpenAI's model_not_found) unless `name` is one of the served model names."""
    from paddle_llm_openai.errors import OpenAIError

    if name not in served:
        raise OpenAIError(404, f"The model `{name}` does not exist (served: {', '.join(served)})", param="model",
                          code="model_not_found")
    return name


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None,
          cached_tokens: int = 0) -> dict:
    """OpenAI usage; prompt_tokens_details.cached_tokens: the prompt tokens llm found in its prefix
    cache (OpenAI's and vLLM's field); reasoning_tokens (those inside the thinking span, of
    completion_tokens) adds completion_tokens_details when the output was split (None: not reported)."""
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
         "total_tokens": prompt_tokens + completion_tokens,
         "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if reasoning_tokens is not None:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return u
