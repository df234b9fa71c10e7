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
  ends). The pipeline turns it back into a Triton error for its client;
- NUM_SEQUENCES (INT32 [1], TensorRT-LLM's num_return_sequences, default 1) asks for that many
  sequences of the prompt (the engine shares their prompt KV blocks); every response then carries
  SEQUENCE_INDEX, and each sequence ends with a response whose finish_reason is set (the last of them
  is the request's FINAL response);
- RETURN_PERF_METRICS (BOOL [1]) adds PERF_METRICS to every response: the request's metrics so far
  as JSON with TensorRT-LLM's names (encode_perf_metrics); the pipeline turns them into tensors.
"""

from __future__ import annotations

import json

ENSEMBLE_STEP = "ensemble_step"   # BOOL [1]: true on the pipeline's requests only
INPUT_IDS = "input_ids"           # INT32 [-1]: the prompt's token ids
ERROR = "error"                   # STRING [1]: {"code", "message"} JSON on a final response
NUM_SEQUENCES = "num_return_sequences"  # INT32 [1]: sequences of the prompt (n), default 1
SEQUENCE_INDEX = "sequence_index"       # INT32 [1]: the sequence a response belongs to
RETURN_PERF_METRICS = "return_perf_metrics"  # BOOL [1]
PERF_METRICS = "perf_metrics"           # STRING [1]: encode_perf_metrics JSON

# TensorRT-LLM's perf-metric outputs and their dtypes (its ensemble config.pbtxt: dims [1] each)
PERF_OUTPUTS = (
    ("kv_cache_alloc_new_blocks", "int32"), ("kv_cache_reused_blocks", "int32"),
    ("kv_cache_alloc_total_blocks", "int32"), ("arrival_time_ns", "int64"),
    ("first_scheduled_time_ns", "int64"), ("first_token_time_ns", "int64"), ("last_token_time_ns", "int64"),
    ("acceptance_rate", "float32"), ("total_accepted_draft_tokens", "int32"), ("total_draft_tokens", "int32"),
)

# what the pipeline asks `llm` for
LLM_OUTPUTS = ("text_output", "output_log_probs", "cumulative_logprob", "finish_reason", ERROR,
               SEQUENCE_INDEX, PERF_METRICS, "num_input_tokens", "num_output_tokens")


def _ns(t: float | None) -> int:
    return 0 if t is None else int(round(t * 1e9))


def encode_perf_metrics(out) -> bytes:
    """A RequestOutput's request-level metrics under TensorRT-LLM's output names. Times are
    CLOCK_MONOTONIC nanoseconds (as TensorRT-LLM's steady-clock times; 0 = not reached yet): arrival
    at the engine, first scheduled, first and latest token. KV blocks: taken from the prefix cache
    (reused), allocated fresh (new: prompt, growth and copies on write), and their sum (total); for
    n > 1 summed over the sequences. No speculative decoding here: acceptance_rate 0, draft tokens 0."""
    return json.dumps({
        "kv_cache_alloc_new_blocks": out.num_new_blocks,
        "kv_cache_reused_blocks": out.num_reused_blocks,
        "kv_cache_alloc_total_blocks": out.num_new_blocks + out.num_reused_blocks,
        "arrival_time_ns": _ns(out.arrival_time),
        "first_scheduled_time_ns": _ns(out.first_scheduled_time),
        "first_token_time_ns": _ns(out.first_token_time),
        "last_token_time_ns": _ns(out.last_token_time),
        "acceptance_rate": 0.0, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0,
    }).encode("utf-8")


def decode_perf_metrics(raw) -> dict:
    """PERF_METRICS output -> {TensorRT-LLM output name: value} (missing names: 0)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        d = json.loads(text)
    except ValueError:
        d = {}
    return {name: d.get(name, 0) for name, _ in PERF_OUTPUTS}


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
