"""The llmapi contract of `tensorrt_llm` (TensorRT-LLM's `all_models/llmapi/tensorrt_llm`): its
inputs mapped onto preprocessing's, and its outputs from an engine-channel frame.

Inputs (max_batch_size 0: one prompt per request): text_input [1] (a 1-D tensor of one prompt),
streaming [1] (needs the decoupled transaction policy), sampling_param_* (best_of, temperature,
top_k, top_p, frequency_penalty, presence_penalty, max_tokens, stop, seed,
exclude_input_from_output, return_perf_metrics), return_finish_reason / return_stop_reason /
return_cumulative_logprob, and `stop` (the stop signal, with the request id of the request to stop).
As the llmapi's SamplingParams: max_tokens 32 when not sent, greedy unless temperature, top_k or
top_p is sent, and text_output holds the generated text only.
LoRA (lora_request): lora_id, lora_name and lora_path together (TensorRT-LLM's rule), lora_ckpt_source
"hf" (the default; "nemo" is refused); served when lora_path is the folder of an adapter the `llm`
instance has loaded (lora_modules at start, or a runtime load), which the request then runs with; a
request never makes the server read a folder it names (llm/lora_tasks.py).
Refused, naming the input: image_url (no multimodal models here), best_of > 1.

Outputs (names and dtypes of its config.pbtxt): text_output [1] BYTES; finish_reason / stop_reason
[1] BYTES ("stop", "length", "cancelled" / the stop string, or "None" as its str(None)) when asked;
cumulative_logprob [1] FP32 when asked; with sampling_param_return_perf_metrics the kv_cache_*
counters (INT32 / FP32), the *_time_ns timings (INT64, CLOCK_MONOTONIC nanoseconds) and the
draft-token figures.
"""

from __future__ import annotations

import numpy as np

from paddle_llm_engine.errors import InvalidRequestError

DEFAULT_MAX_TOKENS = 32  # tensorrt_llm.SamplingParams.max_tokens

# llmapi input -> preprocessing input
SAMPLING_INPUTS = {
    "sampling_param_temperature": "temperature", "sampling_param_top_k": "top_k", "sampling_param_top_p": "top_p",
    "sampling_param_frequency_penalty": "frequency_penalty", "sampling_param_presence_penalty": "presence_penalty",
    "sampling_param_max_tokens": "max_tokens", "sampling_param_seed": "random_seed",
    "sampling_param_stop": "stop_words",
}
UNSUPPORTED = {
    "image_url": "multimodal inputs are not supported (no vision model on this engine)",
    "sampling_param_logits_post_processor_name": "named logits post-processors are not supported",
}


def _flag(tensors: dict, name: str) -> bool:
    v = tensors.get(name)
    return v is not None and v.size > 0 and bool(v.reshape(-1)[0])


def _asked(arr) -> bool:
    """A tensor that asks for something: non-empty, not all-empty strings."""
    if arr is None or arr.size == 0:
        return False
    return not (arr.dtype == np.object_ and all(v in (b"", "") for v in arr.reshape(-1)))


def preprocessing_row(tensors: dict, decoupled: bool) -> tuple[dict, dict]:
    """llmapi inputs (name -> numpy array) -> (preprocessing inputs shaped [1, ...], flags
    {"stream", "perf", "finish_reason", "stop_reason", "cum"}). Raises InvalidRequestError naming the input."""
    for name, why in UNSUPPORTED.items():
        if _asked(tensors.get(name)):
            raise InvalidRequestError(name, why)
    text = tensors.get("text_input")
    if text is None or text.size == 0:
        raise InvalidRequestError("text_input", "required: the prompt (a `stop` request alone may omit it)")
    if text.ndim != 1 or text.size != 1:
        raise InvalidRequestError("text_input", f"one prompt as a 1-D tensor of one element, got shape {list(text.shape)}")
    best_of = tensors.get("sampling_param_best_of")
    if best_of is not None and best_of.size and int(best_of.reshape(-1)[0]) != 1:
        raise InvalidRequestError("sampling_param_best_of", f"only 1 is supported, got {int(best_of.reshape(-1)[0])}")
    stream = _flag(tensors, "streaming")
    if stream and not decoupled:
        raise InvalidRequestError("streaming", "streaming needs the decoupled transaction policy: set "
                                               "model_transaction_policy { decoupled: true } in tensorrt_llm's config.pbtxt")
    cum = _flag(tensors, "return_cumulative_logprob")
    row = {"text_input": text.reshape(1, 1), "stream": np.array([[stream]]),
           "exclude_input_in_output": np.array([[True]]), "return_log_probs": np.array([[cum]])}
    for src, dst in SAMPLING_INPUTS.items():
        v = tensors.get(src)
        if v is not None and v.size:
            row[dst] = v.reshape(1, -1)
    if "max_tokens" not in row:
        row["max_tokens"] = np.array([[DEFAULT_MAX_TOKENS]], dtype=np.int32)
    if not any(k in row for k in ("temperature", "top_k", "top_p")):
        row["temperature"] = np.array([[0.0]], dtype=np.float32)  # the llmapi's default: greedy
    flags = {"stream": stream, "perf": _flag(tensors, "sampling_param_return_perf_metrics"),
             "finish_reason": _flag(tensors, "return_finish_reason"),
             "stop_reason": _flag(tensors, "return_stop_reason"), "cum": cum}
    return row, flags


LORA_INPUTS = ("lora_id", "lora_name", "lora_path")


def _text(arr) -> str:
    v = arr.reshape(-1)[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def lora_request(tensors: dict) -> dict | None:
    """The llmapi's LoRARequest inputs -> the generate frame's "lora" (engine_channel/protocol.py),
    None when none of lora_id / lora_name / lora_path is sent. Raises InvalidRequestError naming the
    input (the first one sent when one of the three is missing; a tensor of more than one value)."""
    given = {k: tensors[k] for k in LORA_INPUTS + ("lora_ckpt_source",) if _asked(tensors.get(k))}
    if not any(k in given for k in LORA_INPUTS):
        if "lora_ckpt_source" in given:
            raise InvalidRequestError("lora_ckpt_source", "lora_id, lora_name, and lora_path must all be provided "
                                                          "together")
        return None
    if any(k not in given for k in LORA_INPUTS):  # named after the first one sent
        raise InvalidRequestError(next(k for k in LORA_INPUTS if k in given),
                                  "lora_id, lora_name, and lora_path must all be provided together")
    for k in LORA_INPUTS:
        if given[k].size != 1:
            raise InvalidRequestError(k, f"expected a scalar tensor, got shape {list(given[k].shape)}")
    source = _text(given["lora_ckpt_source"]) if "lora_ckpt_source" in given else "hf"
    if source not in ("hf", "nemo"):
        raise InvalidRequestError("lora_ckpt_source", f"must be one of ('hf', 'nemo'), got {source!r}")
    return {"task_id": int(given["lora_id"].reshape(-1)[0]), "name": _text(given["lora_name"]),
            "path": _text(given["lora_path"]), "ckpt_source": source}


def rename_error(message: str) -> str:
    """A preprocessing error under the llmapi input's name ("max_tokens: ..." -> "sampling_param_max_tokens: ...")."""
    for src, dst in SAMPLING_INPUTS.items():
        for prefix in (f"{dst}: ", f"{dst} "):
            if message.startswith(prefix):
                return src + message[len(dst):]
    return message


def output_arrays(frame: dict, flags: dict) -> dict[str, np.ndarray]:
    """The llmapi outputs of one engine-channel output frame (engine_channel/protocol.py)."""
    out = {"text_output": np.array([str(frame.get("text", "")).encode("utf-8")], dtype=np.object_)}
    reason = str(frame.get("finish_reason") or "") or "None"
    if reason == "abort":
        reason = "cancelled"
    if flags["finish_reason"]:
        out["finish_reason"] = np.array([reason.encode()], dtype=np.object_)
    if flags["stop_reason"]:  # the matched stop string or id is not carried on the channel
        out["stop_reason"] = np.array([b"None"], dtype=np.object_)
    if flags["cum"]:
        out["cumulative_logprob"] = np.array([float(frame.get("cum", 0.0))], dtype=np.float32)
    if flags["perf"]:
        p = frame.get("perf") or {}
        reused, new = int(p.get("kv_cache_reused_blocks", 0)), int(p.get("kv_cache_alloc_new_blocks", 0))
        out.update({
            "kv_cache_reused_block": np.array([reused], dtype=np.int32),
            "kv_cache_missed_block": np.array([new], dtype=np.int32),  # blocks not found in the prefix cache
            "kv_cache_alloc_new_blocks": np.array([new], dtype=np.int32),
            "kv_cache_alloc_total_blocks": np.array([reused + new], dtype=np.int32),
            "kv_cache_hit_rate": np.array([reused / (reused + new) if reused + new else 0.0], dtype=np.float32),
        })
        for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns"):
            out[name] = np.array([int(p.get(name, 0))], dtype=np.int64)
        out["acceptance_rate"] = np.array([float(p.get("acceptance_rate", 0.0))], dtype=np.float32)
        out["total_accepted_draft_tokens"] = np.array([int(p.get("total_accepted_draft_tokens", 0))], dtype=np.int32)
        out["total_draft_tokens"] = np.array([int(p.get("total_draft_tokens", 0))], dtype=np.int32)
    return out
