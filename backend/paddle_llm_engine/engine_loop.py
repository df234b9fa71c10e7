"""Run an LLMEngine on its own thread so that callers (Triton's execute()) never block on it.

Callers submit and abort from any thread; commands reach the engine thread through a queue and
are applied between steps. Each request's outputs go to the callback given at submission, called
on the engine thread: callbacks must be quick (the Triton glue only enqueues).
A request is checked in the caller's thread (LLMEngine.check_request): a bad one raises
InvalidRequestError from submit, naming the field, and nothing is queued.
Admission is decided in the caller's thread, at once: the loop counts the requests that are
admitted, not finished and not running (submitted but not yet applied, plus the scheduler's
waiting queue as of the last step or command), less the running slots free as of then (those
requests are about to run, not waiting), and submit raises EngineBusyError when that count reaches
max_num_waiting, instead of letting the request wait behind a step that may take seconds. Without
the free slots, a burst of arrivals during one long step (traffic resuming, a prefill wave) was
refused while the batch had room.
If a step raises, every request in flight gets an error output, the loop stops, `healthy` turns
False, `on_failure(reason)` is called once, and every later submit raises EngineDeadError (the
Triton glue answers it at once with an INTERNAL error naming the original failure). A step that
never returns cannot raise: a watchdog on another thread reads `step_started_at` and calls
`declare_failed(reason)`, which does the same from its own thread (the stuck step's outputs, should
it ever return, go nowhere). Requests submitted but not yet applied by the engine thread when it
fails or stops are answered the same way (a request whose FINAL never comes pins its Triton model:
it can never unload), and no submit can queue a request after the failure was decided.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable

from paddle_llm_engine.engine import LLMEngine
from paddle_llm_engine.errors import EngineBusyError, EngineDeadError
from paddle_llm_engine.outputs import EngineStats, RequestOutput
from paddle_llm_engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
OutputCallback = Callable[[RequestOutput], None]


# The commands callers queue for the engine thread (applied between steps).
@dataclass(frozen=True, slots=True)
class AddCommand:
    """Add a checked request. prepared: LLMEngine.check_request's result; arrival: time.monotonic()
    at submit; timeout_s: the caller's deadline in seconds from arrival (None or 0 = none)."""

    request_id: str
    prepared: object
    num_prompt_tokens: int
    callback: OutputCallback
    arrival: float
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class AbortCommand:
    """Abort a request (its KV blocks freed; its callback gets the aborted output)."""

    request_id: str


@dataclass(frozen=True, slots=True)
class FailAllCommand:
    """End every request in flight with an error output carrying message and error_code."""

    message: str
    error_code: str


@dataclass(frozen=True, slots=True)
class StopCommand:
    """Make the engine thread exit."""


class EngineLoop:
    """Thread owner of one LLMEngine. Thread-safe submit / abort / shutdown."""

    def __init__(self, engine: LLMEngine, on_state: Callable[[EngineStats], None] | None = None,
                 on_failure: Callable[[str], None] | None = None):
        self.engine = engine
        # called on the engine thread after every step and every batch of commands (metrics gauges)
        self.on_state = on_state
        # called once on the engine thread when a step failed, after the requests in flight were failed
        self.on_failure = on_failure
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._callbacks: dict[str, OutputCallback] = {}
        # guards _callbacks and the failure hand-over between the engine thread and declare_failed()
        self._lock = threading.Lock()
        # admission count (see the module docstring), under _admission
        self._admission = threading.Lock()
        self._queued = 0           # AddCommands not yet applied by the engine thread
        self._engine_waiting = engine.num_waiting  # refreshed on the engine thread
        self._engine_free_slots = engine.num_free_seq_slots  # likewise
        self._stopping = False
        self.error: str | None = None
        self.step_started_at: float | None = None  # time.monotonic() of the step in progress
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread.is_alive()

    @property
    def num_waiting(self) -> int:
        """Requests admitted, not finished and not running that no free running slot can take
        (what max_num_waiting bounds; see the module docstring)."""
        with self._admission:
            return self._backlog()

    def _backlog(self) -> int:
        # under _admission
        return max(0, self._queued + self._engine_waiting - self._engine_free_slots)

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               callback: OutputCallback, timeout_s: float | None = None) -> None:
        """Check and queue a request; thread-safe, never blocks on the engine.

        timeout_s: the caller's deadline in seconds from now (None or 0 = none); see
        LLMEngine.add_prepared (the engine's max_request_seconds applies as well).
        Raises, with nothing queued: EngineDeadError when the engine has failed, EngineBusyError
        when max_num_waiting requests already wait beyond the free running slots, InvalidRequestError (naming the field)
        for a bad request. What the engine thread refuses later (a duplicate id, a bad timeout, the
        engine's own waiting backstop) arrives through the callback as finish_reason "error"."""
        self.raise_if_dead()
        arrival = time.monotonic()
        limit = self.engine.config.max_num_waiting
        with self._admission:
            waiting = self._backlog()
            if waiting >= limit:
                raise EngineBusyError(waiting, limit)
            self._queued += 1
        try:
            prepared = self.engine.check_request(prompt_token_ids, params)
        except BaseException:
            with self._admission:
                self._queued -= 1
            raise
        with self._lock:  # a failure decided under this lock has drained the queue or will see this add
            if self.error is None and not self._stopping:
                self._commands.put(AddCommand(request_id, prepared, len(prompt_token_ids), callback, arrival,
                                              timeout_s))
                return
        with self._admission:
            self._queued -= 1
        self.raise_if_dead()
        raise EngineDeadError("the engine is stopped")

    def raise_if_dead(self) -> None:
        """Raise EngineDeadError (naming the original failure) unless the loop is running."""
        if not self.healthy:
            raise EngineDeadError(f"the engine failed earlier and serves no requests: {self.error}"
                                  if self.error else "the engine is stopped")

    def abort(self, request_id: str) -> None:
        self._commands.put(AbortCommand(request_id))

    def fail_all(self, message: str, error_code: str = "unavailable") -> None:
        """Between steps: abort every request in flight (KV blocks freed) and end each with an error
        output (finish_reason "error", `error_code`) carrying `message`; the loop keeps serving.
        Used when a drain's grace period ends."""
        self._commands.put(FailAllCommand(message, error_code))

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not finished (approximate when read from another thread)."""
        return len(self._callbacks) + self._commands.qsize()

    def declare_failed(self, reason: str) -> bool:
        """From any thread (a watchdog): the engine is considered failed now, as if its step had
        raised `reason`. False when it had already failed or stopped."""
        with self._lock:
            if self.error is not None or self._stopping:
                return False
            self.error = reason
            self._stopping = True
            callbacks, self._callbacks = self._callbacks, {}
        self._fail_callbacks(callbacks, f"engine failure: {reason}")
        self._commands.put(StopCommand())  # should the stuck step return, the thread then exits
        return True

    def shutdown(self, timeout: float = 10.0, message: str = "the engine is stopped") -> None:
        """Stop the engine thread (joined for at most `timeout` s); every request still in flight or
        queued then gets an error output (finish_reason "error", error_code "unavailable") carrying
        `message`, so that no caller waits for an output that cannot come."""
        with self._lock:
            self._stopping = True
        self._commands.put(StopCommand())
        self._thread.join(timeout)
        with self._lock:
            callbacks, self._callbacks = self._callbacks, {}
        self._fail_callbacks(callbacks, message, "unavailable", failure=False)

    # -- engine thread ---------------------------------------------------------------------------
    def _apply(self, cmd: AddCommand | AbortCommand | FailAllCommand) -> None:
        if isinstance(cmd, AddCommand):
            self._apply_add(cmd)
        elif isinstance(cmd, AbortCommand):
            out = self.engine.abort_request(cmd.request_id)
            self._refresh_waiting()
            with self._lock:
                cb = self._callbacks.pop(cmd.request_id, None)
            if out is not None and cb is not None:
                cb(out)
        elif isinstance(cmd, FailAllCommand):
            with self._lock:
                callbacks, self._callbacks = self._callbacks, {}
            for rid in callbacks:
                self.engine.abort_request(rid)
            self._refresh_waiting()
            log.warning("failing %d requests in flight: %s", len(callbacks), cmd.message)
            for rid, cb in callbacks.items():
                cb(RequestOutput(request_id=rid, finished=True, finish_reason="error", error=cmd.message,
                                 error_code=cmd.error_code))

    def _apply_add(self, cmd: AddCommand) -> None:
        rid, cb, t = cmd.request_id, cmd.callback, cmd.arrival
        try:
            self.engine.add_prepared(rid, cmd.prepared, arrival_time=t, timeout_s=cmd.timeout_s)
        except (ValueError, EngineBusyError) as e:
            busy = isinstance(e, EngineBusyError)
            self._refresh_waiting(applied_add=True)
            cb(RequestOutput(request_id=rid, finished=True, finish_reason="error", error=str(e),
                             error_code="unavailable" if busy else "invalid_arg",
                             rejected="queue_full" if busy else "invalid",
                             num_prompt_tokens=cmd.num_prompt_tokens, arrival_time=t))
            if getattr(e, "field", None) is None:
                log.warning("request %s rejected: %s", rid, e)
            return
        self._refresh_waiting(applied_add=True)
        with self._lock:
            self._callbacks[rid] = cb

    def _refresh_waiting(self, applied_add: bool = False) -> None:
        """Engine thread: the admission count follows the engine (an applied AddCommand moves from
        queued to the scheduler's waiting queue, or out when refused)."""
        with self._admission:
            if applied_add:
                self._queued -= 1
            self._engine_waiting = self.engine.num_waiting
            self._engine_free_slots = self.engine.num_free_seq_slots

    def _drain_commands(self) -> bool:
        """Apply queued commands; block for one when the engine is idle. False on StopCommand."""
        applied = False
        try:
            cmd = self._commands.get(block=not self.engine.has_unfinished_requests())
            while True:
                if isinstance(cmd, StopCommand):
                    return False
                self._apply(cmd)
                applied = True
                cmd = self._commands.get_nowait()
        except queue.Empty:
            pass
        if applied and not self.engine.has_unfinished_requests():
            self._report_state()  # e.g. an abort freed blocks and no step follows
        return True

    def _run(self) -> None:
        while not self._stopping:
            if not self._drain_commands():
                return
            if not self.engine.has_unfinished_requests():
                continue
            self.step_started_at = time.monotonic()
            try:
                outputs = self.engine.step()
            except Exception as e:  # engine failure: fail everyone, stop, report not ready
                self.step_started_at = None
                self._on_step_error(f"{type(e).__name__}: {e}")
                return
            self.step_started_at = None
            with self._lock:
                if self._stopping:
                    return  # declared failed while the step ran: its outputs go nowhere
                delivered = []
                for out in outputs:
                    cb = self._callbacks.get(out.request_id)
                    if cb is None:
                        continue
                    if out.finished:
                        del self._callbacks[out.request_id]
                    delivered.append((cb, out))
            for cb, out in delivered:
                try:
                    cb(out)
                except Exception:
                    log.exception("output callback of request %s failed", out.request_id)
            self._refresh_waiting()
            self._report_state()

    def _on_step_error(self, reason: str) -> None:
        with self._lock:
            if self.error is not None:
                return  # a watchdog declared the failure first
            self.error = reason
            callbacks, self._callbacks = self._callbacks, {}
        log.error("engine step failed, failing %d requests:\n%s", len(callbacks), traceback.format_exc())
        self._fail_callbacks(callbacks, f"engine failure: {reason}")

    def _fail_queued(self, message: str, error_code: str = "internal") -> None:
        """Answer every AddCommand still queued with an error output (any thread; the queue hands each
        command to one taker). Called once the failure or stop is decided, so nothing new is queued."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if not isinstance(cmd, AddCommand):
                continue
            with self._admission:
                self._queued -= 1
            try:
                cmd.callback(RequestOutput(request_id=cmd.request_id, finished=True, finish_reason="error",
                                           error=message, error_code=error_code,
                                           num_prompt_tokens=cmd.num_prompt_tokens, arrival_time=cmd.arrival))
            except Exception:
                log.exception("output callback of request %s failed", cmd.request_id)

    def _fail_callbacks(self, callbacks: dict, message: str, error_code: str = "internal",
                        failure: bool = True) -> None:
        """End the queued requests and those of `callbacks` with an error output; then, for a
        failure (not a shutdown), call on_failure."""
        self._fail_queued(message, error_code)
        for rid, cb in callbacks.items():
            try:
                cb(RequestOutput(request_id=rid, finished=True, finish_reason="error", error=message,
                                 error_code=error_code))
            except Exception:
                log.exception("output callback of request %s failed", rid)
        if failure and self.on_failure is not None:
            try:
                self.on_failure(self.error)
            except Exception:
                log.exception("failure callback failed")

    def _report_state(self) -> None:
        if self.on_state is not None:
            try:
                self.on_state(self.engine.stats())
            except Exception:
                log.exception("state callback failed")
