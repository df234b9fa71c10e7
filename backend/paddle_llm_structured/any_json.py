"""The schema of "any JSON object" (OpenAI / vLLM `json_object`, TensorRT-LLM guide type `json`).

Unbounded, a small greedy model given "any object" invents keys until max_tokens (SmolLM2-135M,
temperature 0: `population_density_per_square_kilometer`, ... , cut at 200 tokens). Here every
object and array of the answer has at most MAX_ENTRIES entries, so it must close: measured on
SmolLM2-135M at max_tokens 200, 8 entries let the greedy answer close (122 tokens), 12 and 16 did
not. Values are any JSON (strings, numbers, booleans, null, nested objects and arrays, each bounded
the same way). A client that needs more sends a JSON schema.
"""

from __future__ import annotations

MAX_ENTRIES = 8  # keys per object, items per array


def any_json_schema(types: tuple[str, ...] = ("object",)) -> dict:
    """A JSON schema (a new dict) for a JSON value of the given top-level container types
    ("object" and / or "array") whose objects and arrays hold at most MAX_ENTRIES entries."""
    value = {"$ref": "#/$defs/value"}
    containers = {"object": {"type": "object", "additionalProperties": value, "maxProperties": MAX_ENTRIES},
                  "array": {"type": "array", "items": value, "maxItems": MAX_ENTRIES}}
    top = [containers[t] for t in types]
    schema = dict(top[0]) if len(top) == 1 else {"anyOf": top}
    schema["$defs"] = {"value": {"anyOf": [{"type": ["string", "number", "boolean", "null"]},
                                           containers["object"], containers["array"]]}}
    return schema
