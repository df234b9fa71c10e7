"""Errors the engine raises to its callers; the Triton glue maps them to Triton error codes.

An InvalidRequestError names the request field at fault in the engine's own terms ("prompt",
"prompt_token_ids", a SamplingParams field, the guide's field as the caller labelled it) and carries
an ErrorCode; a server front end renames the field to its own input names for its clients."""

import enum


class ErrorCode(enum.Enum):
    """Why a request was refused (InvalidRequestError.code); the values are stable lower-case names."""

    INVALID_ARGUMENT = "invalid_argument"  # a caller's own check with no finer code (the default)
    PROMPT_EMPTY = "prompt_empty"  # no prompt tokens
    PROMPT_TOO_LONG = "prompt_too_long"  # the prompt leaves no room for output in max_model_len
    TOKEN_OUT_OF_VOCABULARY = "token_out_of_vocabulary"  # a prompt token id outside the model's vocabulary
    MAX_TOKENS_TOO_LARGE = "max_tokens_too_large"  # prompt + max_tokens exceeds max_model_len
    INVALID_SAMPLING_PARAM = "invalid_sampling_param"  # a SamplingParams field out of its range
    INVALID_GUIDE = "invalid_guide"  # a guided-decoding constraint that does not compile
    INVALID_REASONING = "invalid_reasoning"  # a reasoning parser or budget this engine cannot apply
    INVALID_LORA = "invalid_lora"  # an unknown LoRA adapter, or an adapter folder the engine cannot use


class InvalidRequestError(ValueError):
    """A request field has a bad value; `field` names it (mapped to Triton INVALID_ARG), `code`
    (an ErrorCode) says which rule refused it. str(): "<field>: <message>"."""

    def __init__(self, field: str, message: str, code: ErrorCode = ErrorCode.INVALID_ARGUMENT):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message  # without the field name (contracts re-raise it under their own names)
        self.code = code


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
