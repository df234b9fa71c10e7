"""Errors the engine raises to its callers; the Triton glue maps them to Triton error codes."""


class InvalidRequestError(ValueError):
    """A request field has a bad value; `field` names it (mapped to Triton INVALID_ARG)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message  # without the field name (contracts re-raise it under their own names)


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an internal failure; no request can be served."""


class EngineBusyError(RuntimeError):
    """The waiting queue is full; the request was not queued (mapped to Triton UNAVAILABLE)."""
