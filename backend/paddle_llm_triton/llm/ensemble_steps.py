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


class EnsembleStepHandler:
    """engine_channel.server.Handler for one llm instance.

    loop: the instance's EngineLoop; on_output(out): the instance's metrics hook (engine thread,
    must only enqueue); default_max_tokens: the `llm` parameter (0 = max_model_len - prompt);
    max_model_len: the engine's; instance: for error messages; drain: refuses new requests while
    the instance drains."""

    def __init__(self, loop: EngineLoop, on_output: Callable[[RequestOutput], None], default_max_tokens: int,
                 max_model_len: int, instance: str, on_rejected: Callable[[str], None] | None = None,
                 drain: Drain | None = None, stream_interval: int = 1):
        self.loop = loop
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
            self.loop.submit(rid, prompt_ids, params, lambda out: self._on_output(step, out),
                             timeout_s=float(timeout_s) if timeout_s else None)
        except InvalidRequestError as e:  # the engine's rules (LLMEngine.check_request): the request's error frame
            self._on_rejected("invalid")
            emit(protocol.error_frame("invalid_arg", str(triton_error(e))), True)
        except EngineBusyError as e:
            self._on_rejected("queue_full")
            raise RefusedRequest(str(e), "unavailable") from None
        except EngineDeadError as e:
            self._on_rejected("not_serving")
            raise RefusedRequest(f"llm instance {self.instance} is not serving: {e}", "unavailable") from None
        return rid

    def abort(self, request_id: str) -> None:
        self.loop.abort(request_id)

    def _on_output(self, step: _Step, out: RequestOutput) -> None:
        """Engine thread: metrics, then at most one frame."""
        self._on_metrics(out)
        if out.finish_reason == "error" or out.error:  # failed, or aborted at its deadline
            step.emit(protocol.error_frame(out.error_code, out.error), True)
            return
        flush = step.buffers.add(out)
        if flush is not None:
            step.emit(protocol.output_frame(out, flush, step.logprobs, step.perf), out.finished)
