"""OpenAI error bodies, and Triton's error messages -> HTTP status + OpenAI parameter name.

Body (OpenAI's): {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}.
Statuses: 400 invalid_request_error (a bad parameter, named in `param`), 404 model_not_found,
503 service_unavailable (Triton says the server is full, draining, past a deadline, or not serving
`llm`), 500 internal_error (anything else).

Why messages: on Triton 2.51 a gRPC stream (the only call a decoupled model takes) carries an error
as its message only, with no code (docs/operations/limits.md). `llm` writes every INVALID_ARG as
"<field>: <reason>" with field one of its inputs (`sampling_parameters.<key>`, `text_input`, ...) and
every UNAVAILABLE with a fixed prefix or phrase (server busy, deadline exceeded, shutting down), so
classify() reads them back; `to_openai_param` renames the field into the request's own words.
"""

from __future__ import annotations

import re
from typing import Mapping

from fastapi.responses import JSONResponse

# llm's input names that an INVALID_ARG message starts with ("<field>: <reason>")
_LLM_FIELDS = ("sampling_parameters", "text_input", "exclude_input_in_output", "stream", "return_", "timeout")
# phrases of llm's / Triton's UNAVAILABLE messages (full queue, deadline, drain, model not loaded)
_UNAVAILABLE = ("server busy:", "deadline exceeded:", "is shutting down and takes no new requests",
                "the server shut down before the request finished", "the engine is stopped",
                "unknown model", "is not ready", "is not serving", "failed earlier and serves no requests")
# the gRPC channel's own failures: their text names internal addresses and gRPC internals, which a
# client neither needs nor should see; they are answered with a fixed message (logged in full)
_TRANSPORT = ("failed to connect", "connection refused", "statuscode.unavailable", "socket closed",
              "connect failed", "statuscode.internal: received rst_stream")
TRANSPORT_MESSAGE = "the model server is not reachable or not ready (loading or restarting); retry shortly"
_FIELD_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\[\]]*): (.*)$", re.S)


class OpenAIError(Exception):
    """An error answered in OpenAI's body. status: HTTP status; param: the request parameter at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or {400: "invalid_request_error", 404: "invalid_request_error",
                              503: "service_unavailable", 500: "internal_error"}.get(status, "error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad_param(param: str, message: str) -> OpenAIError:
    """400 naming `param`; the message starts with the parameter's name."""
    return OpenAIError(400, f"{param}: {message}", param=param, code="invalid_parameter")


def classify(message: str, names: Mapping[str, str] | None = None) -> OpenAIError:
    """A Triton / llm error message -> OpenAIError. names: llm field -> OpenAI parameter for this
    request (see to_openai_param)."""
    low = message.lower()
    if any(p in low for p in _TRANSPORT):
        import logging

        logging.getLogger("paddle_llm_openai").warning("Triton unreachable: %s", message)
        return OpenAIError(503, TRANSPORT_MESSAGE, code="service_unavailable")
    if any(p in low for p in _UNAVAILABLE):
        return OpenAIError(503, message, code="service_unavailable")
    m = _FIELD_RE.match(message)
    if m and m.group(1) == "sampling_parameters.lora_name":  # the adapter the model names is not (any more) loaded
        return OpenAIError(404, f"model: {m.group(2)}", param="model", code="model_not_found")
    if m and m.group(1).startswith(_LLM_FIELDS):
        param = to_openai_param(m.group(1), names or {})
        return OpenAIError(400, f"{param}: {m.group(2)}", param=param, code="invalid_parameter")
    return OpenAIError(500, message, code="internal_error")


def to_openai_param(field: str, names: Mapping[str, str]) -> str:
    """llm's field name -> the request's parameter: `names` first (the longest matching prefix, e.g.
    "sampling_parameters.structured_outputs" -> "response_format"), else
    `sampling_parameters.<key>` -> `<key>` (vLLM's keys are OpenAI's names)."""
    best = None
    for k in names:
        if field == k or field.startswith(k + "."):
            if best is None or len(k) > len(best):
                best = k
    if best is not None:
        return names[best]
    if field.startswith("sampling_parameters."):
        return field[len("sampling_parameters."):].split(".")[0]
    return field
