"""The steps of one `ensemble` row around its engine request: the inputs it accepts, preprocessing
and postprocessing (BLS calls: not decoupled, so they do not meet the deadlock engine_channel/
avoids), the engine request built from preprocessing's outputs, and TensorRT-LLM's optional outputs.

Every function raises StepError (with the Triton error code) when a step fails or an input is one
this engine does not support; the pipeline ends the client's request with it.
"""

from __future__ import annotations

import re

import numpy as np

from paddle_llm_triton.engine_channel import protocol, wire
from paddle_llm_triton.ensemble.requests import Flight, Row, StepError, as_text, bls_error_code

# inputs of `ensemble` that preprocessing takes (the others are read here)
PRE_INPUTS = ("text_input", "max_tokens", "stream", "stop_words", "bad_words", "end_id", "pad_id", "top_k",
              "top_p", "temperature", "repetition_penalty", "presence_penalty", "frequency_penalty",
              "length_penalty", "min_tokens", "min_length", "seed", "random_seed", "exclude_input_in_output",
              "return_log_probs", "beam_width", "num_return_sequences", "apply_chat_template",
              "guided_decoding_guide_type", "guided_decoding_guide", "reasoning_max_tokens", "thinking_token_budget")
PRE_OUTPUTS = ["INPUT_IDS", "SAMPLING_PARAMETERS", "STREAM", "EXCLUDE_INPUT_IN_OUTPUT", "RETURN_LOG_PROBS"]
POST_OUTPUTS = ["text_output", "cum_log_probs", "output_log_probs"]
# an InvalidRequestError's text: "<input or input.key>: why" (a crash's text names the model instead)
_INPUT_ERROR = re.compile(r"^[a-z_][a-z0-9_.]*: ")

# TensorRT-LLM ensemble inputs declared so that its clients are not refused by Triton, for features
# this engine does not have: sending one (non-empty, or true for a flag) is INVALID_ARG saying so.
UNSUPPORTED_INPUTS = {
    "decoder_text_input": "encoder-decoder models are not supported",
    "return_context_logits": "context logits are not returned by this engine",
    "return_generation_logits": "generation logits are not returned by this engine",
    "prompt_embedding_table": "prompt tuning (prompt embedding tables) is not supported",
    "prompt_table_extra_id": "prompt tuning (prompt embedding tables) is not supported",
    "prompt_vocab_size": "prompt tuning (prompt embedding tables) is not supported",
    "embedding_bias_words": "embedding bias is not supported",
    "embedding_bias_weights": "embedding bias is not supported",
}
# the engine channel's frame limit, less room for the rest of the generate frame
_MAX_LORA_FRAME_BYTES = wire.MAX_FRAME_BYTES - (1 << 20)


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


def reject_unsupported(tensors: dict) -> None:
    """Raise StepError (INVALID_ARG) naming the first UNSUPPORTED_INPUTS tensor that asks for something
    (non-empty; for a flag: true). tensors: input name -> numpy array, as the request carried them."""
    pb = _pb()
    for name, why in UNSUPPORTED_INPUTS.items():
        arr = tensors.get(name)
        if arr is None or arr.size == 0:
            continue
        if arr.dtype == np.bool_ and not arr.any():
            continue  # return_context_logits / return_generation_logits false: nothing asked
        if arr.dtype == np.object_ and all(v in (b"", "") for v in arr.reshape(-1)):
            continue
        raise StepError(f"{name}: {why}", pb.TritonError.INVALID_ARG)


def preprocess(model: str, index: int, row: dict) -> Row:
    """Row `index` of the request (input name -> that row's array) through the preprocessing model
    `model` (a BLS call) -> its Row. Raises StepError with preprocessing's error."""
    pb = _pb()
    lora = lora_request(row)  # before the BLS call: a bad LoRA input fails fast
    inputs = [pb.Tensor(n, v) for n, v in row.items() if n in PRE_INPUTS]
    try:
        pre = exec_step(pb.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=PRE_OUTPUTS))
    except StepError as e:
        # preprocessing answers only a bad input with an error response (INVALID_ARG, "<input>: why");
        # Triton 2.51 hands a BLS caller every error response as INTERNAL, so the code is restored here
        if e.code == pb.TritonError.INTERNAL and _INPUT_ERROR.match(str(e)):
            raise StepError(str(e), pb.TritonError.INVALID_ARG) from None
        raise
    n = row.get("num_return_sequences")  # validated by preprocessing

    def flag(name):
        v = row.get(name)
        return v is not None and bool(v.reshape(-1)[0])

    return Row(index, {k: pb.get_output_tensor_by_name(pre, k).as_numpy() for k in PRE_OUTPUTS},
               row["text_input"], 1 if n is None else int(n.reshape(-1)[0]), flag("return_perf_metrics"),
               flag("return_num_input_tokens"), flag("return_num_output_tokens"), lora)


def lora_request(row: dict) -> dict | None:
    """TensorRT-LLM's LoRA inputs of one row (lora_task_id, lora_weights, lora_config) -> the
    generate frame's "lora" (engine_channel/protocol.py), None without them. The llm instance
    checks the tensors against its model and keeps them by task id (llm/lora_tasks.py); here only
    what the frame needs: a task id with any weights, and a size the channel carries. Raises
    StepError (INVALID_ARG) naming the input."""
    pb = _pb()
    task, weights, config = (row.get(k) for k in ("lora_task_id", "lora_weights", "lora_config"))
    weights = weights if weights is not None and weights.size else None
    config = config if config is not None and config.size else None
    if task is None or task.size == 0:
        if weights is not None or config is not None:
            raise StepError("lora_task_id: must be set for LoRA inference (with lora_weights / lora_config)",
                            pb.TritonError.INVALID_ARG)
        return None
    if task.size != 1:
        raise StepError(f"lora_task_id: one id per row, got {task.size}", pb.TritonError.INVALID_ARG)
    if weights is not None and protocol.encoded_array_bytes(weights.nbytes) > _MAX_LORA_FRAME_BYTES:
        raise StepError(f"lora_weights: {weights.nbytes} bytes are more than a request can carry to the engine "
                        f"(about {_MAX_LORA_FRAME_BYTES * 3 // 4} bytes)", pb.TritonError.INVALID_ARG)
    return {"task_id": int(task.reshape(-1)[0]),
            "weights": protocol.encode_array(weights) if weights is not None else None,
            "config": protocol.encode_array(config) if config is not None else None}


def engine_request(f: Flight, r: Row) -> dict:
    """The `generate` frame (engine_channel/protocol.py) of row r's engine request f."""
    pre = r.pre
    stream = bool(pre["STREAM"].reshape(-1)[0])
    exclude = bool(pre["EXCLUDE_INPUT_IN_OUTPUT"].reshape(-1)[0])
    sp = pre["SAMPLING_PARAMETERS"].reshape(-1)[0]
    # TensorRT-LLM: a non-streamed answer starts with the prompt unless exclude_input_in_output;
    # a stream never repeats it
    prompt_text = None if stream or exclude else as_text(r.text.reshape(-1)[0])
    return protocol.generate_request(
        pre["INPUT_IDS"].reshape(-1).tolist(), as_text(sp), r.n, stream, prompt_text,
        bool(pre["RETURN_LOG_PROBS"].reshape(-1)[0]), r.perf, f.client.client_id,
        timeout_s=f.client.timeout_us / 1e6 if f.client.timeout_us else None, lora=r.lora)


def extra_outputs(r: Row, frame: dict, batched: bool) -> list:
    """TensorRT-LLM's optional outputs, each [1, 1]: batch_index (B > 1), sequence_index (n > 1),
    num_input_tokens / num_output_tokens (a streamed response: its own tokens) and the perf
    metrics when asked."""
    pb = _pb()
    extra = []
    if batched:
        extra.append(pb.Tensor("batch_index", np.array([[r.index]], dtype=np.int32)))
    if r.n > 1:
        extra.append(pb.Tensor("sequence_index", np.array([[int(frame.get("seq", 0))]], dtype=np.int32)))
    if r.num_input_tokens:
        extra.append(pb.Tensor("num_input_tokens", np.array([[frame.get("num_prompt_tokens", 0)]], dtype=np.int32)))
    if r.num_output_tokens:
        stream = bool(r.pre["STREAM"].reshape(-1)[0])
        n = len(frame.get("ids") or []) if stream else frame.get("num_output_tokens", 0)
        extra.append(pb.Tensor("num_output_tokens", np.array([[n]], dtype=np.int32)))
    if r.perf:
        values = frame.get("perf") or {}
        for name, dtype in protocol.PERF_OUTPUTS:
            extra.append(pb.Tensor(name, np.array([[values.get(name, 0)]], dtype=dtype)))
    return extra


def postprocess(model: str, frame: dict) -> list:
    """One output frame through the postprocessing model `model` (a BLS call) -> the response's
    POST_OUTPUTS tensors (text_output [1, 1] bytes, cum_log_probs, output_log_probs float32).
    Raises StepError with postprocessing's error."""
    pb = _pb()
    text = np.array([[str(frame.get("text", "")).encode("utf-8")]], dtype=np.object_)
    lps = np.asarray(frame.get("logprobs") or [], dtype=np.float32).reshape(1, -1)
    cum = np.array([[float(frame.get("cum", 0.0))]], dtype=np.float32)
    resp = exec_step(pb.InferenceRequest(
        model_name=model, requested_output_names=POST_OUTPUTS,
        inputs=[pb.Tensor("TEXT_DELTA", text), pb.Tensor("OUTPUT_LOG_PROBS", lps), pb.Tensor("CUM_LOG_PROB", cum)]))
    return [pb.Tensor(n, pb.get_output_tensor_by_name(resp, n).as_numpy()) for n in POST_OUTPUTS]


def exec_step(req):
    """Run a BLS request; raise StepError with the step's message and Triton error code if it failed."""
    resp = req.exec()
    if resp.has_error():
        err = resp.error()
        raise StepError(err.message(), bls_error_code(err))
    return resp
