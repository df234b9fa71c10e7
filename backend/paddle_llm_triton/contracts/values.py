"""JSON values a client sent -> Python values, strictly; errors name the field (shared by vllm.py and
guided.py)."""

from __future__ import annotations

from paddle_llm_engine.errors import InvalidRequestError


def to_bool(field: str, v) -> bool:
    """true / false, as JSON booleans or as the strings "true" / "false" (any case)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise InvalidRequestError(field, f"expected true or false, got {v!r}")
