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
    """The request was refused because `waiting` requests (admitted, not finished, not running)
    already reach the admission limit `limit` (max_num_waiting); nothing was queued. Mapped to
    Triton UNAVAILABLE: the client may retry later or elsewhere."""

    def __init__(self, waiting: int, limit: int):
        super().__init__(f"server busy: {waiting} requests waiting (max_num_waiting {limit}); retry later")
        self.waiting = waiting
        self.limit = limit
