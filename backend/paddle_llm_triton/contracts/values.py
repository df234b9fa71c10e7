"""JSON values a client sent -> Python values, strictly; errors name the field (shared by vllm.py and
guided.py)."""

from __future__ import annotations

import json

from paddle_llm_engine.errors import InvalidRequestError

# the engine's names of request fields (InvalidRequestError.field) that Triton's inputs name otherwise
TRITON_NAMES = {"prompt": "text_input", "prompt_token_ids": "input_ids", "eos_token_ids": "end_id"}


def triton_error(e: InvalidRequestError) -> InvalidRequestError:
    """An engine InvalidRequestError under the name Triton's inputs give its field (TRITON_NAMES:
    the prompt is text_input, its token ids input_ids, eos_token_ids end_id), code and message kept;
    `e` itself when the names agree."""
    name = TRITON_NAMES.get(e.field)
    return e if name is None else InvalidRequestError(name, e.message, e.code)


# deepest nesting of arrays / objects a client's JSON may have (sampling_parameters, guides, schemas):
# far beyond any real schema, far below what recursive code (the parser, schema rewriting,
# llguidance's conversion) can take
MAX_JSON_DEPTH = 100


def parse_json(field: str, text: str | bytes):
    """A client's JSON text -> the value. Raises InvalidRequestError naming `field` for text that is
    not JSON, or that nests arrays / objects deeper than MAX_JSON_DEPTH (json.loads itself raises
    RecursionError near the interpreter's recursion limit); for an object, the error names the key
    that nests too deeply (`field.key`)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRequestError(field, f"not UTF-8: {e}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequestError(field, f"not valid JSON: {e}") from None
    except RecursionError:
        value = None
        depth = MAX_JSON_DEPTH + 1
    else:
        depth = json_depth(value)
    if depth > MAX_JSON_DEPTH:
        if isinstance(value, dict):
            field = next((f"{field}.{k}" for k, v in value.items() if json_depth(v) >= MAX_JSON_DEPTH), field)
        raise InvalidRequestError(field, f"nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def json_depth(value) -> int:
    """Nesting depth of arrays / objects in a parsed JSON value (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        todo.extend((x, d + 1) for x in items)
    return deepest


def to_bool(field: str, v) -> bool:
    """true / false, as JSON booleans or as the strings "true" / "false" (any case)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise InvalidRequestError(field, f"expected true or false, got {v!r}")
