"""The internal protocol between the `ensemble` pipeline and the `llm` model; both sides import it.

The pipeline (ensemble_pipeline.py) marks every request it sends to `llm` with the BOOL input
ENSEMBLE_STEP = true; no client does (README "Model `llm`"). Only such a request gets this
treatment from `llm` (model_repository/llm/1/model.py); every other request is answered by the
vLLM-backend contract, and one that sends INPUT_IDS is INVALID_ARG:
- the prompt is preprocessing's token ids in INPUT_IDS; `text_input` is the prompt text, prepended
  to a non-streamed answer unless exclude_input_in_output (TensorRT-LLM semantics, so a stream with
  exclude_input_in_output false is accepted and simply never repeats the prompt);
- every response carries `output_log_probs` (per token) and `cumulative_logprob`, both zeros unless
  `return_logprobs`, because TensorRT-LLM's outputs are always present; and `output_ids`;
- a failure after the request was accepted arrives as a final data response whose ERROR output holds
  {"code", "message"} JSON (finish_reason "error"), never as an error response: Triton 2.51's BLS
  response iterator loses an error response that follows data responses (measured: it then never
  ends). The pipeline turns it back into a Triton error for its client.
"""

from __future__ import annotations

import json

ENSEMBLE_STEP = "ensemble_step"   # BOOL [1]: true on the pipeline's requests only
INPUT_IDS = "input_ids"           # INT32 [-1]: the prompt's token ids
ERROR = "error"                   # STRING [1]: {"code", "message"} JSON on a final response

# what the pipeline asks `llm` for
LLM_OUTPUTS = ("text_output", "output_log_probs", "cumulative_logprob", "finish_reason", ERROR)


def encode_error(code: str | None, message: str | None) -> bytes:
    """The ERROR output of a failed request; `code` is the engine's error_code ("invalid_arg", ...)."""
    return json.dumps({"code": code, "message": message or "error"}).encode("utf-8")


def decode_error(raw) -> tuple[str, str | None]:
    """ERROR output -> (message, error_code); a malformed value is its own message, code None."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        d = json.loads(text)
        return str(d.get("message", "error")), d.get("code")
    except (ValueError, AttributeError):
        return text, None
