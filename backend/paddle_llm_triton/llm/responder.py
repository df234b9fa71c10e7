"""The response path of the decoupled `llm` model: one thread that turns engine outputs into
Triton responses, so the engine thread never blocks on Triton's IPC.

Streaming requests get one response per output that carries text (held-back tokens ride along
with the next one). When a stream falls behind (the engine queued several outputs of a sequence
before this thread reached the first), the queued ones go out as one response carrying all their
tokens, as vLLM's output collector merges the deltas of a lagging consumer and TensorRT-LLM streams
what is ready: at low load every token is still its own response, under load the number of Triton
responses (each an IPC round trip, Python tensors and a gRPC message) stops growing with the token
rate. `coalesce=False` (config.pbtxt `coalesce_stream_responses: false`) sends one response per
output always. `stream_interval` N > 1 (config.pbtxt) sends one response per N tokens at any load. Non-streaming requests get exactly one response at the end (HTTP /generate
accepts only one): delta_buffer.py. Every request ends with a response flagged FINAL. Only direct
clients of `llm` come through here (the ensemble's requests arrive on the engine channel,
ensemble_steps.py), so all pb_utils calls of this path are on two threads: execute() and this one.

Client cancellation: every `poll_s` (config.pbtxt cancellation_check_period_ms, default 0.1 s) this thread sweeps every request in flight, streamed or
not, whether or not anything was sent yet, and calls response_sender.is_cancelled() once each (as
the TensorRT-LLM backend's cancellation thread does every cancellation_check_period_ms); a cancelled
one is aborted in the engine (its KV blocks are freed before the next step) and gets an empty final
response. The sweep runs on its own clock, not per output: is_cancelled() is an IPC round trip to
the server, never made per token. What the sweep can see is what Triton reports: 2.51's HTTP
endpoints report a dropped connection only once a response of the request has been written (docs/operations/cancellation.md).
What a response holds is the request kind's (vllm_request.ResponseOptions.response): this thread
only decides when to send, sends, and watches for cancellation.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from paddle_llm_engine.outputs import RequestOutput
from paddle_llm_triton.llm.delta_buffer import SequenceBuffers
from paddle_llm_triton.errors import triton_code
from paddle_llm_triton.llm.vllm_request import ResponseOptions

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    sender: object
    opts: ResponseOptions
    buffers: SequenceBuffers
    sent_any: bool = False
    cancelled: bool = False
    # discard() sets `closed` under `lock` before execute() answers the request itself: the sweep
    # never calls is_cancelled() on a sender whose final response another thread sent (that
    # crashed tritonserver 2.51).
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    # a non-streamed request of n > 1 sequences: their flushes until the last ends (one response)
    parts: dict = field(default_factory=dict)


_STOP = object()  # the queue's last item at shutdown
_MAX_BATCH = 1024  # outputs taken off the queue at once (a bound on one pass, not a limit on requests)


class Responder:
    """Owns the response thread. `decode_token(id, skip_special_tokens) -> str` renders logprob entries."""

    def __init__(self, abort: Callable[[str], None], decode_token: Callable[[int, bool], str],
                 on_finished: Callable[[RequestOutput], None] | None = None, poll_s: float = 0.1,
                 coalesce: bool = True, stream_interval: int = 1):
        self._abort = abort
        self._decode_token = decode_token
        self._on_finished = on_finished
        self._poll_s = poll_s
        self._coalesce = coalesce
        self._stream_interval = stream_interval  # tokens per streamed response (delta_buffer.py)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._stop = False
        self.send_started: float | None = None  # time.monotonic() of the send in progress
        self._thread = threading.Thread(target=self._run, name="llm-responder", daemon=True)
        self._thread.start()

    def register(self, request_id: str, sender, opts: ResponseOptions) -> None:
        """Track a request submitted to the engine: its Triton response sender and what it asked back."""
        with self._lock:
            self._live[request_id] = _Pending(sender, opts, SequenceBuffers(opts.stream, opts.prompt_text,
                                                                            self._stream_interval))

    def discard(self, request_id: str) -> None:
        """Forget a registered request that never reached the engine. On return the response thread
        neither uses its sender nor will, so the caller may send its final response."""
        with self._lock:
            p = self._live.pop(request_id, None)
        if p is not None:
            with p.lock:  # waits for an is_cancelled() of the sweep in progress
                p.closed = True

    def push(self, out: RequestOutput) -> None:
        """Engine-thread callback: enqueue only."""
        self._q.put(out)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Send what is queued (the final errors of a stopping engine among it), then stop the
        response thread; joined for at most `timeout` s."""
        self._q.put(_STOP)
        self._thread.join(timeout)
        self._stop = True

    # -- response thread -------------------------------------------------------------------------
    def _run(self) -> None:
        next_sweep = time.monotonic() + self._poll_s
        while not self._stop:
            try:
                out = self._q.get(timeout=max(0.0, next_sweep - time.monotonic()))
            except queue.Empty:
                out = None
            batch = [] if out is None else [out]
            while batch and len(batch) < _MAX_BATCH:  # what else is ready: a lagging stream's outputs
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in batch
            if stop:
                batch = batch[:batch.index(_STOP)]
            held = self._held(batch) if self._coalesce else set()
            for i, o in enumerate(batch):
                try:
                    self._handle(o, hold=i in held)
                except Exception:
                    log.exception("sending the response of %s failed", o.request_id)
            if stop:
                return
            now = time.monotonic()
            if now >= next_sweep:
                try:
                    self._check_cancelled()
                except Exception:
                    log.exception("cancellation sweep failed")
                next_sweep = now + self._poll_s

    @staticmethod
    def _held(batch: list[RequestOutput]) -> set[int]:
        """Indexes of outputs whose sequence has a later, non-error output in `batch`."""
        held, later = set(), set()
        for i in range(len(batch) - 1, -1, -1):
            o = batch[i]
            key = (o.request_id, o.sequence_index)
            if key in later:
                held.add(i)
            if not (o.error or o.finish_reason == "error"):
                later.add(key)
        return held

    def _check_cancelled(self) -> None:
        """One is_cancelled() per request in flight (this thread also sends their final responses,
        so none of them is past its final response here)."""
        with self._lock:
            live = list(self._live.items())
        for rid, p in live:
            with p.lock:
                cancelled = not p.closed and not p.cancelled and p.sender.is_cancelled()
            if cancelled:
                p.cancelled = True
                log.info("request %s cancelled by the client%s: aborting", rid,
                         "" if p.sent_any else " before any response")
                self._abort(rid)

    def _handle(self, out: RequestOutput, hold: bool = False) -> None:
        import triton_python_backend_utils as pb_utils

        with self._lock:
            p = self._live.get(out.request_id)
            if p is not None and out.finished:
                del self._live[out.request_id]
        if p is None:
            return
        if out.finished and self._on_finished is not None:
            self._on_finished(out)
        if out.finish_reason == "error" or out.error:  # failed, or aborted at its deadline
            err = pb_utils.TritonError(out.error or "error", triton_code(out.error_code))
            self._send(p, pb_utils.InferenceResponse(error=err), final=True)
            return
        if p.cancelled:  # seen by the sweep, which aborted it: send nothing more but the end
            if out.finished:
                self._send(p, None, final=True)
            return
        flush = p.buffers.add(out, hold=hold and not out.finished)
        if flush is None:
            return
        if p.opts.n > 1 and not p.opts.stream:  # the vLLM backend: one response with all n answers
            p.parts[out.sequence_index] = (flush, out)
            if out.finished:
                self._send(p, p.opts.response_n(p.parts, self._decode_token), final=True)
            return
        self._send(p, p.opts.response(flush, out, self._decode_token), final=out.finished)

    def _send(self, p: _Pending, resp, final: bool) -> None:
        import triton_python_backend_utils as pb_utils

        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self.send_started = time.monotonic()  # read by the health watchdog: a send that never returns
        try:
            p.sender.send(resp, flags=flags)
        finally:
            self.send_started = None
        p.sent_any = True
