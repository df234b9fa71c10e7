"""The `ensemble`'s engine requests as an `llm` instance serves them: `generate` frames of the engine
channel (engine_channel/protocol.py) in, engine requests out, their outputs back as frames.

Runs on two threads and never calls pb_utils: `start` / `abort` on the channel's selector thread,
`_on_output` on the engine thread (it only buffers and enqueues; the channel encodes and writes).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Callable

from paddle_llm_engine import EngineBusyError, EngineDeadError, EngineLoop, InvalidRequestError
from paddle_llm_engine.outputs import RequestOutput
from paddle_llm_triton.engine_channel import protocol
from paddle_llm_triton.contracts.defaults import apply_default_max_tokens
from paddle_llm_triton.contracts.values import triton_error
from paddle_llm_triton.contracts.trtllm import from_pipeline_json
from paddle_llm_triton.llm.delta_buffer import SequenceBuffers
from paddle_llm_triton.llm.lora_tasks import LoraCacheFull, LoraTasks
from paddle_llm_triton.lifecycle.drain import Drain, DrainingError

log = logging.getLogger(__name__)


class RefusedRequest(Exception):
    """A `generate` frame this instance does not start; `channel_code` is the error frame's code."""

    def __init__(self, message: str, channel_code: str):
        super().__init__(message)
        self.channel_code = channel_code


@dataclass
class _Step:
    emit: Callable[[dict, bool], None]
    buffers: SequenceBuffers
    logprobs: bool
    perf: bool
    lora: dict | None = None  # the request's LoRA (LoraTasks.acquire), released when it ends


class EnsembleStepHandler:
    """engine_channel.server.Handler for one llm instance.

    loop: the instance's EngineLoop; on_output(out): the instance's metrics hook (engine thread,
    must only enqueue); default_max_tokens: the `llm` parameter (0 = max_model_len - prompt);
    max_model_len: the engine's; instance: for error messages; drain: refuses new requests while
    the instance drains; lora_tasks: TensorRT-LLM's LoRA task cache (None: enable_lora 0)."""

    def __init__(self, loop: EngineLoop, on_output: Callable[[RequestOutput], None], default_max_tokens: int,
                 max_model_len: int, instance: str, on_rejected: Callable[[str], None] | None = None,
                 drain: Drain | None = None, stream_interval: int = 1, lora_tasks: LoraTasks | None = None):
        self.loop = loop
        self.lora_tasks = lora_tasks
        self.stream_interval = stream_interval  # tokens per streamed frame (delta_buffer.py)
        self.drain = drain
        self._on_metrics = on_output
        self._on_rejected = on_rejected or (lambda reason: None)
        self.default_max_tokens = default_max_tokens
        self.max_model_len = max_model_len
        self.instance = instance

    def start(self, msg: dict, emit) -> str:
        """Parse a generate frame (already validated by preprocessing: a bad one here is a bug or a
        foreign client, refused as invalid_arg) and submit it to the engine."""
        if self.drain is not None:
            try:
                self.drain.refuse_if_draining()
            except DrainingError as e:
                self._on_rejected("draining")
                raise RefusedRequest(str(e), "unavailable") from None
        try:
            prompt_ids = msg["prompt_ids"]
            if not isinstance(prompt_ids, list) or not prompt_ids or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in prompt_ids):
                raise InvalidRequestError("input_ids", "must be a non-empty list of token ids")
            params = from_pipeline_json(msg.get("sampling_parameters"))  # errors name the ensemble's tensors
            n = int(msg.get("n", 1))
            stream = bool(msg.get("stream", False))
        except (KeyError, TypeError, ValueError) as e:  # InvalidRequestError is a ValueError
            self._on_rejected("invalid")
            raise RefusedRequest(str(e), "invalid_arg") from None
        prompt_text = msg.get("prompt_text")
        want_lp = bool(msg.get("logprobs", False))
        apply_default_max_tokens(params, len(params.truncated_prompt(prompt_ids, self.max_model_len)),
                                 self.max_model_len, self.default_max_tokens)
        params.n = n
        if want_lp and params.logprobs is None:
            params.logprobs = 0  # TensorRT-LLM's output_log_probs: the chosen token's logprob
        params.compute_logprobs = want_lp
        step = _Step(emit, SequenceBuffers(stream, prompt_text if isinstance(prompt_text, str) else None,
                                         self.stream_interval),
                     want_lp, bool(msg.get("perf", False)))
        rid = uuid.uuid4().hex
        timeout_s = msg.get("timeout_s")  # the ensemble client's request timeout
        try:
            params.lora_name = self._acquire_lora(step, msg.get("lora"))
            self.loop.submit(rid, prompt_ids, params, lambda out: self._on_output(step, out),
                             timeout_s=float(timeout_s) if timeout_s else None)
        except InvalidRequestError as e:  # the engine's rules (LLMEngine.check_request): the request's error frame
            self._release_lora(step)
            self._on_rejected("invalid")
            emit(protocol.error_frame("invalid_arg", str(triton_error(e))), True)
        except (EngineBusyError, LoraCacheFull) as e:
            self._release_lora(step)
            self._on_rejected("queue_full")
            raise RefusedRequest(str(e), "unavailable") from None
        except EngineDeadError as e:
            self._release_lora(step)
            self._on_rejected("not_serving")
            raise RefusedRequest(f"llm instance {self.instance} is not serving: {e}", "unavailable") from None
        return rid

    def _acquire_lora(self, step: _Step, lora) -> str | None:
        """The engine adapter name of the frame's "lora" (None: the base model); step.lora is set
        once the task is held. Raises InvalidRequestError naming the client's input, LoraCacheFull."""
        if lora is None:
            return None
        if not isinstance(lora, dict):
            raise InvalidRequestError("lora_task_id", f"malformed LoRA entry {type(lora).__name__}")
        if self.lora_tasks is None:
            field = "lora_id" if lora.get("path") is not None else "lora_task_id"
            raise InvalidRequestError(field, "this model serves no LoRA adapters (the llm parameter enable_lora is 0)")
        lora = dict(lora)
        for key, field in (("weights", "lora_weights"), ("config", "lora_config")):
            if lora.get(key) is not None:
                try:
                    lora[key] = protocol.decode_array(lora[key], field)
                except ValueError as e:
                    raise InvalidRequestError(field, str(e).split(": ", 1)[-1]) from None
        name = self.lora_tasks.acquire(lora)
        step.lora = lora
        return name

    def _release_lora(self, step: _Step) -> None:
        if step.lora is not None and self.lora_tasks is not None:
            lora, step.lora = step.lora, None
            self.lora_tasks.release(lora)

    def abort(self, request_id: str) -> None:
        self.loop.abort(request_id)

    def _on_output(self, step: _Step, out: RequestOutput) -> None:
        """Engine thread: metrics, then at most one frame."""
        self._on_metrics(out)
        if out.finish_reason == "error" or out.error:  # failed, or aborted at its deadline
            self._release_lora(step)
            step.emit(protocol.error_frame(out.error_code, out.error), True)
            return
        if out.finished:
            self._release_lora(step)
        flush = step.buffers.add(out)
        if flush is not None:
            step.emit(protocol.output_frame(out, flush, step.logprobs, step.perf), out.finished)
