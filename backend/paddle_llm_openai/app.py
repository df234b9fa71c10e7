"""The FastAPI application: routes, error handlers, the request accounting middleware.

`Frontend` holds what the routes share: the gRPC client of `llm` (made in the app's lifespan, on
its event loop), the served model names, the chat renderer (chat_template.ChatRenderer, loaded at
start-up off the event loop; it also picks the tool parser), the reasoning parser setting
(--reasoning-parser, reasoning.py), the metrics and the drain state.

Disconnects: every request runs beside a watcher of the connection (`_until_disconnect`) from the
moment it is accepted, so one that waits in the engine's queue is cancelled when its client leaves,
streamed or not (a stream's first `llm` response is awaited before the status line goes out); once a
stream has started, Starlette cancels it when the client goes away (its generator's `finally`
cancels the gRPC calls).
Readiness: /v1 routes and /tokenize, /detokenize answer 503 (`model_not_ready`) until Triton's `llm`
is ready (checked per request, a ready answer trusted for READY_TTL_S), instead of listing a model
that cannot serve or passing on a raw gRPC error.
Draining (cli.py, on SIGTERM): /health/ready is 503 and new /v1 requests are 503 at once; requests
in flight go on. API keys and the body-size limit: guards.py, inside the accounting (so 401 and 413
are counted per endpoint).
LoRA adapters (lora.py): each one `llm` serves is a model of /v1/models and of the completion routes;
vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter exist when llm's allow_runtime_lora_updating is on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from paddle_llm_openai import chat, completions
from paddle_llm_openai.errors import OpenAIError
from paddle_llm_openai.guards import DEFAULT_MAX_BODY_BYTES, Guards
from paddle_llm_openai.lora import LoraAdapters, not_found_route
from paddle_llm_openai.metrics import FrontendMetrics
from paddle_llm_openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                       LoadLoraAdapterRequest, ModelCard, ModelList, TokenizeRequest,
                                       UnloadLoraAdapterRequest)
from paddle_llm_openai.triton_client import TritonLLM

log = logging.getLogger("paddle_llm_openai")


READY_TTL_S = 1.0  # how long a "ready" answer of Triton is trusted before asking again


class Frontend:
    """Shared state. served_names: model names clients may send (the first is the main one)."""

    def __init__(self, tritonserver_url: str, model: str, served_names: list[str], tokenizer: str | None,
                 triton_metrics_url: str | None, reasoning_parser: str = "auto", lora_key: str = ""):
        self.tritonserver_url = tritonserver_url
        self.model = model
        self.served_names = served_names
        self.tokenizer = tokenizer
        self.reasoning_parser = reasoning_parser  # reasoning.py: auto / none / a family
        self.metrics = FrontendMetrics(triton_metrics_url)
        self.llm: TritonLLM | None = None
        self.created = int(time.time())
        self.draining = False
        self.in_flight = 0
        self._renderer = None
        self._ready_at = -1.0   # time.monotonic() of the last ready answer
        self.llm_config: dict | None = None  # llm's Triton model config (read once, when first ready)
        self.lora = LoraAdapters(self, lora_key)  # llm's LoRA adapters as models (lora.py)

    async def serving(self) -> bool:
        """llm is ready (a ready answer is trusted for READY_TTL_S; a not-ready one is asked again
        on the next request). The first ready answer also reads llm's model config."""
        now = time.monotonic()
        if now - self._ready_at < READY_TTL_S:
            return True
        # llm's own readiness, not the server's: the server reports not ready while another model (say
        # a tensor-parallel one) is reloaded, and llm serves meanwhile
        if self.llm is None or not await self.llm.is_model_ready():
            return False
        self._ready_at = now
        if self.llm_config is None:
            self.llm_config = await self.llm.model_config()
            log.info("requests without max_tokens: %s", _default_max_tokens_note(self.llm_config))
        return True

    def max_model_len(self) -> int | None:
        """llm's max_model_len (its config parameter; 0 there: config.json's max_position_embeddings),
        None before llm was ready once."""
        if self.llm_config is None:
            return None
        raw = _parameter(self.llm_config, "max_model_len")
        if raw and raw.strip() not in ("", "0"):
            return int(raw)
        return _max_position_embeddings(self.tokenizer)

    @property
    def renderer(self):
        if self._renderer is None:
            if not self.tokenizer:
                raise OpenAIError(500, "this server was started without --tokenizer: chat is not available",
                                  code="internal_error")
            from paddle_llm_openai.chat_template import ChatRenderer

            self._renderer = ChatRenderer(self.tokenizer)
        return self._renderer


def _parameter(config: dict, key: str) -> str | None:
    return ((config.get("parameters") or {}).get(key) or {}).get("string_value")


def _max_position_embeddings(model_dir: str | None) -> int | None:
    import json
    import os

    try:
        with open(os.path.join(model_dir or "", "config.json")) as f:
            return int(json.load(f).get("max_position_embeddings"))
    except (OSError, ValueError, TypeError):
        return None


def _default_max_tokens_note(config: dict) -> str:
    raw = (_parameter(config, "default_max_tokens") or "0").strip()
    if raw in ("", "0"):
        return ("generate until EOS or max_model_len (llm's default_max_tokens 0; OpenAI documents 16 for "
                "/v1/completions: set default_max_tokens 16 in llm's config.pbtxt for that)")
    return f"at most {raw} tokens (llm's default_max_tokens)"


_GATED = ("/v1/", "/tokenize", "/detokenize")


class _Accounting:
    """ASGI middleware: /v1 requests in flight, drain refusals, per-endpoint status and time."""

    def __init__(self, app, fe: Frontend):
        self.app, self.fe = app, fe

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = self.fe.metrics.endpoint(path)
        is_v1 = path.startswith(_GATED)
        if is_v1 and self.fe.draining:
            resp = OpenAIError(503, "the server is shutting down and takes no new requests; retry on another "
                                    "replica", code="service_unavailable").response()
            self.fe.metrics.observe(endpoint, 503, 0.0)
            return await resp(scope, receive, send)
        if is_v1 and not await self.fe.serving():
            resp = OpenAIError(503, f"the model is not ready yet (Triton's {self.fe.model} is loading or being "
                                    f"restarted); retry shortly", code="model_not_ready").response()
            resp.headers["Retry-After"] = "1"
            self.fe.metrics.observe(endpoint, 503, 0.0)
            return await resp(scope, receive, send)
        status = [500]
        t0 = time.perf_counter()

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        if is_v1:
            self.fe.in_flight += 1
            self.fe.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            if is_v1:
                self.fe.in_flight -= 1
                self.fe.metrics.in_flight.dec()
            self.fe.metrics.observe(endpoint, status[0], time.perf_counter() - t0)


async def _until_disconnect(request: Request, coro):
    """Run coro; if the client disconnects first, cancel it (its gRPC calls are cancelled) and
    return None."""
    task = asyncio.ensure_future(coro)

    async def watch():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        gone = not task.done()
        if gone:  # the client left (or this handler was cancelled): stop the generation
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if gone:
        log.info("client disconnected: request cancelled")
        return None
    return task.result()


def _param_of(loc) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) if parts else None


def build_app(fe: Frontend, api_keys=(), max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
    """The ASGI app of the frontend `fe`: OpenAI routes, health, metrics, and every error as an
    OpenAI error body (errors.OpenAIError), behind the guards (api_keys: Bearer keys every route but
    the probes needs, none: open; max_body_bytes: the request body limit) and the per-request
    accounting. Raises ValueError for an empty key or a limit <= 0."""
    @asynccontextmanager
    async def lifespan(_app):
        fe.llm = TritonLLM(fe.tritonserver_url, fe.model)
        if fe.tokenizer:
            await asyncio.to_thread(lambda: fe.renderer)  # the tokenizer loads once, before requests
        try:
            yield
        finally:
            await fe.llm.close()
            await fe.metrics.close()

    app = FastAPI(title="paddle-llm OpenAI API", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.frontend = fe
    _error_handlers(app)
    _openai_routes(app, fe)
    _health_routes(app, fe)
    return _Accounting(Guards(app, api_keys, max_body_bytes), fe)


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_req, e: OpenAIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        param = _param_of(first.get("loc", ()))
        if first.get("type") == "extra_forbidden":
            msg = f"Unrecognized request argument supplied: {param}"
        elif first.get("type") == "json_invalid":
            msg, param = f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
        elif first.get("type") == "missing":
            msg = f"{param}: missing required parameter"
        else:
            msg = f"{param}: {first.get('msg', 'invalid value')}"
        return OpenAIError(400, msg, param=param, code="invalid_parameter").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req, e: StarletteHTTPException):
        return OpenAIError(e.status_code, str(e.detail), code=None,
                           type_="invalid_request_error" if e.status_code < 500 else None).response()

    @app.exception_handler(Exception)
    async def _unexpected(_req, e: Exception):
        log.exception("unexpected error")
        return OpenAIError(500, f"{type(e).__name__}: {e}", code="internal_error").response()


async def _lora_body(fe: Frontend, request: Request, cls):
    """The body of a runtime LoRA route as `cls`, once the route exists (lora.not_found_route
    otherwise); a malformed body is 400 as for every route."""
    from pydantic import ValidationError

    if not fe.lora.runtime_updating:
        raise not_found_route()
    try:
        data = await request.json()
    except ValueError as e:
        raise OpenAIError(400, f"the body is not valid JSON: {e}", code="invalid_parameter") from None
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


def _lora_card(fe: Frontend, adapter: dict) -> ModelCard:
    """A LoRA adapter as a model (vLLM's card: root its folder, parent the base model)."""
    return ModelCard(id=adapter["name"], created=fe.created, root=adapter.get("path"), parent=fe.served_names[0])


def _openai_routes(app: FastAPI, fe: Frontend) -> None:
    @app.get("/v1/models")
    async def models():
        cards = [ModelCard(id=n, created=fe.created) for n in fe.served_names]
        cards += [_lora_card(fe, a) for a in await fe.lora.adapters()]
        return ModelList(data=cards).model_dump()

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name in fe.served_names:
            return ModelCard(id=name, created=fe.created).model_dump()
        for a in await fe.lora.adapters(refresh=True):
            if a["name"] == name:
                return _lora_card(fe, a).model_dump()
        raise OpenAIError(404, f"The model `{name}` does not exist", param="model", code="model_not_found")

    # vLLM's runtime LoRA routes (lora.py): 404 unless llm's allow_runtime_lora_updating is on, whatever
    # the body (vLLM registers them only then), so the body is read after that check
    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        req = await _lora_body(fe, request, LoadLoraAdapterRequest)
        return PlainTextResponse(await fe.lora.load(req.lora_name, req.lora_path, bool(req.load_inplace)))

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        req = await _lora_body(fe, request, UnloadLoraAdapterRequest)
        return PlainTextResponse(await fe.lora.unload(req.lora_name))

    async def _serve(request: Request, make, req):
        # watched from acceptance: a request still queued in the engine is cancelled when its client
        # leaves (a stream's make() returns only once the first llm response arrived)
        result = await _until_disconnect(request, make(fe, req))
        if req.stream and result is not None:
            return StreamingResponse(result, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        if result is None:
            return Response(status_code=499)  # nobody is listening any more
        return JSONResponse(result)

    @app.post("/v1/completions")
    async def create_completion(req: CompletionRequest, request: Request):
        return await _serve(request, completions.create, req)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(req: ChatCompletionRequest, request: Request):
        return await _serve(request, chat.create, req)

    # vLLM's tokenizer endpoints (tokenize.py); the template renders off the event loop
    @app.post("/tokenize")
    async def tokenize_route(req: TokenizeRequest):
        from paddle_llm_openai.tokenize import tokenize

        return JSONResponse(await asyncio.to_thread(tokenize, fe, req))

    @app.post("/detokenize")
    async def detokenize_route(req: DetokenizeRequest):
        from paddle_llm_openai.tokenize import detokenize

        return JSONResponse(await asyncio.to_thread(detokenize, fe, req))


def _health_routes(app: FastAPI, fe: Frontend) -> None:
    @app.get("/health")
    async def health():
        ok = fe.llm is not None and await fe.llm.is_live()
        return JSONResponse({"status": "ok" if ok else "triton not live"}, status_code=200 if ok else 503)

    @app.get("/health/ready")
    async def ready():
        if fe.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        ok = fe.llm is not None and await fe.llm.is_ready()
        return JSONResponse({"status": "ready" if ok else f"{fe.model} not ready"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(await fe.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")
