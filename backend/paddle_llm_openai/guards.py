"""Who may call the OpenAI frontend, and how much a request may carry: one ASGI middleware.

- API keys (vLLM's `--api-key` / `VLLM_API_KEY`): when keys are set, every route but the probes
  (`OPEN_PATHS`: /health, /health/ready, /metrics, so that kubelets, load balancers and Prometheus
  need no secret) requires `Authorization: Bearer <key>`; otherwise 401 with OpenAI's error body
  (`invalid_api_key`) and `WWW-Authenticate: Bearer`. Keys are compared in constant time.
- Body size: a request whose Content-Length is above `max_body_bytes` is answered 413 before a byte
  of its body is read; a body without Content-Length (chunked) is read up to the limit and refused
  as soon as it passes it. The app then sees the body as it arrived (replayed from memory).

Order: the key first (a caller without one learns nothing about limits), then the size.
"""

from __future__ import annotations

import hmac

from paddle_llm_openai.errors import OpenAIError

OPEN_PATHS = frozenset({"/health", "/health/ready", "/metrics"})
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def _unauthorized(message: str, code: str | None):
    resp = OpenAIError(401, message, code=code, type_="invalid_request_error").response()
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def _too_large(limit: int, got: str) -> OpenAIError:
    return OpenAIError(413, f"the request body is {got}, above this server's limit of {limit} bytes "
                            f"(--max-request-body-bytes)", code="request_too_large", type_="invalid_request_error")


class _BodyTooLarge(Exception):
    pass


class Guards:
    """ASGI middleware around the app (see the module doc). api_keys: accepted keys (empty: no key
    needed); max_body_bytes: the body limit in bytes (> 0). Raises ValueError for an empty key or a
    limit <= 0."""

    def __init__(self, app, api_keys=(), max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        keys = [k for k in api_keys]
        if any(not k for k in keys):
            raise ValueError("--api-key / VLLM_API_KEY: a key must not be empty")
        if max_body_bytes <= 0:
            raise ValueError(f"--max-request-body-bytes must be > 0, got {max_body_bytes}")
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.max_body_bytes = max_body_bytes

    def authorized(self, headers: dict[bytes, bytes]) -> tuple[bool, str, str | None]:
        """(ok, message, code) for a request's headers (lower-case names, as ASGI gives them)."""
        auth = headers.get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        if not auth or scheme.lower() != b"bearer" or not token.strip():
            return False, ("You didn't provide an API key. You need to provide your API key in an "
                           "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."), None
        token = token.strip()
        # every key compared, in constant time, so timing tells nothing about which one nearly matched
        ok = False
        for k in self.keys:
            ok |= hmac.compare_digest(token, k)
        return ok, ("" if ok else "Incorrect API key provided."), (None if ok else "invalid_api_key")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        if self.keys and scope["path"] not in OPEN_PATHS and scope.get("method") != "OPTIONS":
            ok, message, code = self.authorized(headers)
            if not ok:
                return await _unauthorized(message, code)(scope, receive, send)
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n > self.max_body_bytes:
                return await _too_large(self.max_body_bytes, f"{n} bytes").response()(scope, receive, send)
            return await self.app(scope, receive, send)
        if scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        try:
            messages = await self._read_bounded(receive)
        except _BodyTooLarge:
            return await _too_large(self.max_body_bytes, "larger").response()(scope, receive, send)
        return await self.app(scope, _replay(messages, receive), send)

    async def _read_bounded(self, receive) -> list[dict]:
        """The request's body messages, read whole; _BodyTooLarge once they pass the limit."""
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages  # a disconnect: the app sees it
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                raise _BodyTooLarge
            if not message.get("more_body", False):
                return messages


def _replay(messages: list[dict], receive):
    """A receive() that gives `messages` first, then the connection's own (its disconnect)."""
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
