"""The whitespace a guided JSON output may contain.

llguidance (like vLLM's default) allows any run of JSON whitespace between tokens; a small greedy
model then writes newlines and spaces until max_tokens (seen: 187 whitespace characters of 591,
finish_reason length). The default here is bounded: at each place JSON allows whitespace, at most
DEFAULT_WHITESPACE_PATTERN (one match, llguidance's `whitespace_pattern` semantics).

A request's own choice wins: vLLM's `disable_any_whitespace` (compact JSON) and `whitespace_pattern`
(a regex for each whitespace run), and a schema's own top-level `x-guidance` keys.
"""

from __future__ import annotations

# one space, or one newline and up to 20 spaces of indentation (ten levels of two): what a model
# writes for pretty-printed JSON, never a run that can grow with the number of tokens
DEFAULT_WHITESPACE_PATTERN = r"( |\n {0,20})"


_WHITESPACE_KEYS = ("whitespace_flexible", "whitespace_pattern")


def json_options(whitespace_flexible: bool = True, whitespace_pattern: str | None = None, schema=None) -> dict:
    """llguidance's JSON compile options (the keys of a schema's `x-guidance`) for a request.

    whitespace_pattern: the request's regex for each whitespace run (wins over the flag);
    whitespace_flexible False: compact JSON (no whitespace between tokens); otherwise the bounded
    default. schema: the request's JSON schema; when its own top-level `x-guidance` sets
    whitespace_flexible or whitespace_pattern, that is its choice and no whitespace key is returned
    (llguidance fills only the keys a schema leaves out, and a pattern would override its flag).
    Returns a new dict, e.g. {"whitespace_flexible": False, "whitespace_pattern": "( |...)"}.
    """
    own = schema.get("x-guidance") if isinstance(schema, dict) else None
    if isinstance(own, dict) and any(k in own for k in _WHITESPACE_KEYS):
        return {}
    if whitespace_pattern is not None:
        return {"whitespace_flexible": False, "whitespace_pattern": whitespace_pattern}
    if not whitespace_flexible:
        return {"whitespace_flexible": False}
    return {"whitespace_flexible": False, "whitespace_pattern": DEFAULT_WHITESPACE_PATTERN}
