"""Guided decoding in the two client contracts -> the engine's GuideSpec (checked on arrival).

vLLM (`sampling_parameters` keys `guided_decoding`, vLLM's GuidedDecodingParams, and
`structured_outputs`, its newer name with the same fields): a JSON object, or a string holding
one (the Triton vLLM backend reads both forms), with exactly one of
  json         a JSON schema (object, or a string holding it)
  regex        a regular expression the whole output matches (Rust `regex` syntax)
  choice       a list of strings; the output is one of them
  grammar      a GBNF / EBNF grammar (`root ::= ...`, as llama.cpp and xgrammar) or a Lark grammar
  json_object  true: any JSON object
and the options disable_any_whitespace (compact JSON), whitespace_pattern (a regex for each JSON
whitespace run; wins), disable_additional_properties, disable_fallback and backend (accepted; there
is one backend, llguidance, and no fallback). structural_tag is refused as not implemented; any
other field is refused as unknown.

JSON guides on both contracts are closed and bounded (GuideSpec's defaults, paddle_llm_structured):
every object of a schema allows only the keys the schema names unless it says
`additionalProperties` itself (so disable_additional_properties is always on; false does not open
a schema, since vLLM clients send false by default), and JSON whitespace is one space or a newline
with indentation unless the request sets disable_any_whitespace or whitespace_pattern.

TensorRT-LLM (`ensemble` tensors): guided_decoding_guide_type "json" (any JSON object or array,
as TensorRT-LLM's built-in JSON grammar, with at most any_json.MAX_ENTRIES entries per object /
array; the guide is not used), "json_schema", "regex",
"ebnf_grammar" (the guide holds the schema / pattern / grammar), with guided_decoding_guide.

Every guide is compiled here (without a tokenizer, a few milliseconds), so a malformed schema,
regex or grammar is an InvalidRequestError naming the field that carries it.
"""

from __future__ import annotations

import json

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.guided import GuideSpec
from paddle_llm_structured.any_json import any_json_schema
from paddle_llm_triton.contracts.values import parse_json, to_bool

VLLM_GUIDE_KEYS = ("guided_decoding", "structured_outputs")
_VLLM_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
               "json_object": "json_object"}
_VLLM_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
                 "disable_fallback", "backend")
_VLLM_UNSUPPORTED = ("structural_tag",)

TRTLLM_GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
_TRTLLM_KINDS = {"json_schema": "json_schema", "regex": "regex", "ebnf_grammar": "grammar"}
TRTLLM_ANY_JSON = json.dumps(any_json_schema(("object", "array")))  # bounded: see any_json


def from_vllm(field: str, value) -> GuideSpec | None:
    """`sampling_parameters.guided_decoding` / `.structured_outputs` -> a checked GuideSpec, or None
    when no constraint field is set (vLLM: all constraints None = unguided). field: the key's full
    name, e.g. "sampling_parameters.structured_outputs"."""
    if isinstance(value, str):
        value = parse_json(field, value) if value.strip() else {}
    if not isinstance(value, dict):
        raise InvalidRequestError(field, f"expected a JSON object, got {value!r}")
    value, given, opts, ws = _vllm_options(field, value)
    if not given:
        return None
    key = given[0]
    sub = f"{field}.{key}"
    spec = GuideSpec(kind=_VLLM_KINDS[key], value=_vllm_guide_text(sub, key, value[key]), field=sub,
                     whitespace_flexible=not opts.get("disable_any_whitespace", False),
                     whitespace_pattern=ws)
    spec.check()
    return spec


def _vllm_options(field: str, value: dict) -> tuple[dict, list[str], dict, str | None]:
    """Check the keys of a vLLM guide object: (the object with a false json_object dropped, the
    kinds given, the boolean options, whitespace_pattern). Raises InvalidRequestError naming the key."""
    for k in value:
        if k in _VLLM_UNSUPPORTED and value[k] is not None:
            raise InvalidRequestError(f"{field}.{k}", "not implemented here (supported: "
                                                      f"{', '.join(_VLLM_KINDS)})")
        if k not in _VLLM_KINDS and k not in _VLLM_OPTIONS and k not in _VLLM_UNSUPPORTED:
            raise InvalidRequestError(f"{field}.{k}", "unknown key (supported: "
                                                      f"{', '.join(list(_VLLM_KINDS) + list(_VLLM_OPTIONS))})")
    if value.get("json_object") is not None and not to_bool(f"{field}.json_object", value["json_object"]):
        value = {k: v for k, v in value.items() if k != "json_object"}  # false = not this kind
    given = [k for k in _VLLM_KINDS if value.get(k) is not None]
    if len(given) > 1:
        raise InvalidRequestError(field, f"only one kind of guide per request, got {', '.join(given)}")
    opts = {}
    for k in ("disable_any_whitespace", "disable_additional_properties", "disable_fallback"):
        if value.get(k) is not None:
            opts[k] = to_bool(f"{field}.{k}", value[k])
    ws = value.get("whitespace_pattern")
    if ws is not None and not isinstance(ws, str):
        raise InvalidRequestError(f"{field}.whitespace_pattern", f"expected a string, got {ws!r}")
    backend = value.get("backend")
    if backend is not None and not isinstance(backend, str):
        raise InvalidRequestError(f"{field}.backend", f"expected a string, got {backend!r}")
    return value, given, opts, ws


def _vllm_guide_text(sub: str, key: str, v) -> str:
    """GuideSpec.value of guide kind `key` (vLLM's name) from its value `v`; sub names the key."""
    if key == "json":
        if isinstance(v, str):
            v = parse_json(sub, v)
        if not isinstance(v, (dict, bool)):
            raise InvalidRequestError(sub, f"expected a JSON schema (a JSON object), got {v!r}")
        return json.dumps(v)
    if key == "json_object":  # true (false was dropped)
        return ""
    if key == "choice":
        if not isinstance(v, list) or not v or not all(isinstance(c, str) for c in v):
            raise InvalidRequestError(sub, f"expected a non-empty list of strings, got {v!r}")
        return json.dumps(v)
    if not isinstance(v, str) or (key == "grammar" and not v.strip()):  # regex, grammar
        raise InvalidRequestError(sub, f"expected a non-empty string, got {v!r}" if key == "grammar"
                                  else f"expected a string, got {v!r}")
    return v


def to_vllm(spec: GuideSpec) -> dict:
    """The `structured_outputs` object that from_vllm reads back into an equal GuideSpec (used
    between the ensemble's steps; the field name then says where it came from)."""
    key = {v: k for k, v in _VLLM_KINDS.items()}[spec.kind]
    d: dict = {key: True if spec.kind == "json_object" else
               (json.loads(spec.value) if spec.kind in ("json_schema", "choice") else spec.value)}
    if not spec.whitespace_flexible:
        d["disable_any_whitespace"] = True
    if spec.whitespace_pattern is not None:
        d["whitespace_pattern"] = spec.whitespace_pattern
    if not spec.additional_properties:
        d["disable_additional_properties"] = True
    return d


def from_trtllm(guide_type: str | None, guide: str | None) -> GuideSpec | None:
    """TensorRT-LLM's guided_decoding_guide_type / guided_decoding_guide -> a checked GuideSpec, or
    None when neither is sent (an empty type counts as not sent)."""
    if not guide_type:
        if guide:
            raise InvalidRequestError("guided_decoding_guide_type", "required when guided_decoding_guide is sent "
                                                                    f"(one of {', '.join(TRTLLM_GUIDE_TYPES)})")
        return None
    if guide_type not in TRTLLM_GUIDE_TYPES:
        raise InvalidRequestError("guided_decoding_guide_type",
                                  f"unknown guide type {guide_type!r} (one of {', '.join(TRTLLM_GUIDE_TYPES)})")
    if guide_type == "json":  # TensorRT-LLM's built-in JSON grammar; it does not read the guide
        spec = GuideSpec(kind="json_schema", value=TRTLLM_ANY_JSON, field="guided_decoding_guide_type")
    else:
        if not guide:
            raise InvalidRequestError("guided_decoding_guide", f"required for guide type {guide_type!r}")
        if guide_type == "json_schema":
            schema = parse_json("guided_decoding_guide", guide)
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError("guided_decoding_guide", "a JSON schema must be a JSON object")
        spec = GuideSpec(kind=_TRTLLM_KINDS[guide_type], value=guide, field="guided_decoding_guide")
    spec.check()
    return spec
