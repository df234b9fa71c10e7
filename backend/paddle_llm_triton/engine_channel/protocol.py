"""The messages between the `ensemble` pipeline and the `llm` instances on the engine channel
(engine_channel/: one connection per engine request, JSON frames); both sides import this module.

ensemble -> llm, the first frame (generate_request):
  {"type": "generate", "client_request_id": the client's Triton request id (logs only),
   "prompt_ids": [int] (preprocessing's), "sampling_parameters": preprocessing's validated JSON,
   "n": sequences of the prompt (TensorRT-LLM num_return_sequences; the engine shares their prompt
   KV blocks), "stream": bool, "prompt_text": str or null (prepended to a non-streamed answer: the
   TensorRT-LLM exclude_input_in_output false), "logprobs": bool (return_log_probs: the chosen
   tokens' logprobs, else zeros), "perf": bool (return_perf_metrics), "timeout_s": the client's
   request timeout in seconds or null (the engine aborts the request at that deadline),
   "lora": null or TensorRT-LLM's LoRA of the request: {"task_id": int, "weights": array or null,
   "config": array or null} (lora_task_id / lora_weights / lora_config; an array is encode_array's
   {"dtype", "shape", "data": base64 of the C-order bytes}), or the llmapi's {"task_id": lora_id,
   "name": lora_name, "path": lora_path, "ckpt_source": lora_ckpt_source or null}}
  then optionally {"type": "abort"} (the client cancelled).
llm -> ensemble, each frame one response of the client's (output_frame):
  {"type": "output", "seq": sequence index, "text": str (whole UTF-8 characters), "ids": [int],
   "logprobs": [float] (one per id; zeros unless asked), "cum": cumulative logprob (0 unless asked),
   "finish_reason": "stop" | "length" | "abort" on the sequence's last frame, else "",
   "seq_finished": bool, "finished": bool (the request's last frame),
   "num_prompt_tokens": int, "num_output_tokens": int (of this sequence so far), "perf": {...}
   (TensorRT-LLM's perf outputs, with "perf")}
  or, ending the request, {"type": "error", "code": "invalid_arg" | "unavailable" | "internal",
  "message": str}. The instance closes the connection after the last frame.
"""

from __future__ import annotations

import base64

import numpy as np

# TensorRT-LLM's perf-metric outputs and their dtypes (its ensemble config.pbtxt: dims [1] each)
PERF_OUTPUTS = (
    ("kv_cache_alloc_new_blocks", "int32"), ("kv_cache_reused_blocks", "int32"),
    ("kv_cache_alloc_total_blocks", "int32"), ("arrival_time_ns", "int64"),
    ("first_scheduled_time_ns", "int64"), ("first_token_time_ns", "int64"), ("last_token_time_ns", "int64"),
    ("acceptance_rate", "float32"), ("total_accepted_draft_tokens", "int32"), ("total_draft_tokens", "int32"),
)


def generate_request(prompt_ids: list[int], sampling_parameters: str, n: int, stream: bool,
                     prompt_text: str | None, logprobs: bool, perf: bool, client_request_id: str = "",
                     timeout_s: float | None = None, lora: dict | None = None) -> dict:
    """The first frame of an engine request (see the module doc)."""
    return {"type": "generate", "client_request_id": client_request_id, "prompt_ids": [int(i) for i in prompt_ids],
            "sampling_parameters": sampling_parameters, "n": int(n), "stream": bool(stream),
            "prompt_text": prompt_text, "logprobs": bool(logprobs), "perf": bool(perf), "timeout_s": timeout_s,
            "lora": lora}


# dtypes an array of a frame may have (the LoRA tensors' TensorRT-LLM dtypes and their widenings)
ARRAY_DTYPES = ("float16", "float32", "int32", "int64", "uint64")


def encode_array(arr: np.ndarray) -> dict:
    """A numpy array as a JSON object: dtype, shape and base64 of its C-order bytes."""
    arr = np.ascontiguousarray(arr)
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": base64.b64encode(arr.tobytes()).decode("ascii")}


def encoded_array_bytes(nbytes: int) -> int:
    """Frame bytes an array of `nbytes` takes (base64)."""
    return 4 * ((nbytes + 2) // 3) + 100


def decode_array(obj, field: str) -> np.ndarray:
    """encode_array's object -> the array. Raises ValueError naming `field` for anything else."""
    try:
        dtype, shape = np.dtype(str(obj["dtype"])), [int(d) for d in obj["shape"]]
        if dtype.name not in ARRAY_DTYPES or any(d < 0 for d in shape):
            raise ValueError(f"dtype {dtype.name} / shape {shape}")
        data = base64.b64decode(obj["data"], validate=True)
        return np.frombuffer(data, dtype).reshape(shape)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{field}: not an encoded array ({e})") from None


def _ns(t: float | None) -> int:
    return 0 if t is None else int(round(t * 1e9))


def perf_metrics(out) -> dict:
    """A RequestOutput's request-level metrics under TensorRT-LLM's output names. Times are
    CLOCK_MONOTONIC nanoseconds (as TensorRT-LLM's steady-clock times; 0 = not reached yet): arrival
    at the engine, first scheduled, first and latest token. KV blocks: taken from the prefix cache
    (reused), allocated fresh (new: prompt, growth and copies on write), and their sum (total); for
    n > 1 summed over the sequences. No speculative decoding here: acceptance_rate 0, draft tokens 0."""
    return {
        "kv_cache_alloc_new_blocks": out.num_new_blocks,
        "kv_cache_reused_blocks": out.num_reused_blocks,
        "kv_cache_alloc_total_blocks": out.num_new_blocks + out.num_reused_blocks,
        "arrival_time_ns": _ns(out.arrival_time),
        "first_scheduled_time_ns": _ns(out.first_scheduled_time),
        "first_token_time_ns": _ns(out.first_token_time),
        "last_token_time_ns": _ns(out.last_token_time),
        "acceptance_rate": 0.0, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0,
    }


def output_frame(out, flush, logprobs: bool, perf: bool) -> dict:
    """The frame for one Flush (llm/delta_buffer.py) of RequestOutput `out`."""
    frame = {"type": "output", "seq": out.sequence_index, "text": flush.text, "ids": flush.ids,
             "logprobs": [float(lp) if logprobs else 0.0 for lp, _ in flush.logprobs],
             "cum": float(out.cumulative_logprob) if logprobs else 0.0,
             "finish_reason": (out.finish_reason or "") if out.sequence_finished else "",
             "seq_finished": bool(out.sequence_finished), "finished": bool(out.finished),
             "num_prompt_tokens": out.num_prompt_tokens, "num_output_tokens": out.num_output_tokens}
    if perf:
        frame["perf"] = perf_metrics(out)
    return frame


def merge_output_frames(a: dict, b: dict) -> dict | None:
    """One frame carrying both `a` and the frame `b` that followed it, or None when they cannot be
    one response: b is not an output frame, belongs to another sequence (n > 1), or a already ended
    its sequence. Text, ids and logprobs are concatenated; everything else (cumulative logprob,
    finish fields, token counts, perf) is b's, the later state."""
    if a.get("type") != "output" or b.get("type") != "output" or a.get("seq") != b.get("seq") \
            or a.get("seq_finished") or a.get("finished"):
        return None
    merged = dict(b)
    merged["text"] = str(a.get("text", "")) + str(b.get("text", ""))
    merged["ids"] = list(a.get("ids") or []) + list(b.get("ids") or [])
    merged["logprobs"] = list(a.get("logprobs") or []) + list(b.get("logprobs") or [])
    return merged


def error_frame(code: str | None, message: str | None) -> dict:
    """A request's failure; `code` is the engine's error_code ("invalid_arg", "unavailable", ...)."""
    return {"type": "error", "code": code or "internal", "message": message or "error"}
