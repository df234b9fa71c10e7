"""A Triton request's timeout -> the engine's per-request timeout (timeout_s of EngineLoop.submit).

Where Triton 2.51 puts a client's timeout (measured with a probe model): tritonclient gRPC
`async_stream_infer(..., timeout=N)` / `infer(..., timeout=N)` and HTTP `/infer` with
`"parameters": {"timeout": N}` arrive as `request.timeout()` (microseconds, 0 = none); HTTP
`generate` / `generate_stream` do not set it: their `"parameters": {"timeout": N}` (or a top-level
`"timeout"` key) arrive only in `request.parameters()`, so that is read when request.timeout() is 0.
A BLS `InferenceRequest(timeout=N)` reaches the called model's request.timeout(). Triton itself
enforces nothing for these models (no dynamic batcher): a probe request with timeout 1 us ran to its
end, so the engine enforces it.
"""

from __future__ import annotations

import json

from paddle_llm_engine.errors import InvalidRequestError

PARAMETER = "timeout"


def timeout_us(request) -> int:
    """The request's timeout in microseconds, 0 = none: request.timeout(), else the request
    parameter `timeout` (HTTP generate). Raises InvalidRequestError naming `timeout` when that
    parameter is not a whole number >= 0."""
    t = int(request.timeout() or 0)
    if t > 0:
        return t
    raw = request.parameters()
    params = json.loads(raw) if isinstance(raw, (str, bytes)) and raw.strip() else (raw or {})
    v = params.get(PARAMETER)
    if v is None:
        return 0
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v.strip())
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidRequestError(PARAMETER, f"the request timeout must be a whole number of microseconds >= 0 "
                                             f"(0 = none), got {v!r}")
    return v


def timeout_seconds(request) -> float | None:
    """timeout_us in seconds, None when the request has no timeout."""
    t = timeout_us(request)
    return t / 1e6 if t else None
