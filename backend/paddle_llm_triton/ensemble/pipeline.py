"""The `ensemble` model as a decoupled Python (BLS) model: preprocessing -> the engine of an `llm`
instance -> postprocessing, called from here, so that client cancellation reaches the engine.

Why not a Triton ensemble: Triton 2.51 does not pass a client's cancellation into the steps of an
ensemble, so `llm` would never learn that the client left and its request would run to the end.
This model is the request the client talks to, so its own `response_sender.is_cancelled()` turns
true when the client cancels (gRPC stop_stream(cancel_requests=True)) or drops the connection
(gRPC or HTTP generate_stream).
Why the engine step is not a BLS call: decoupled BLS streams from several threads of one stub
deadlock in Triton 2.51's Python backend (engine_channel/__init__.py), so the engine request goes
over the engine channel to the least loaded `llm` instance; only the non-decoupled steps
(preprocessing, postprocessing) are BLS calls.

Per client request (one thread each; the engine's own threads do the heavy work):
1. `stop` = true: TensorRT-LLM's stop signal. Every request of this model in flight under the same
   client request id is stopped as in 4; the stop request itself gets one empty final response.
2. The request may carry B rows (inputs shaped [B, 1], max_batch_size >= B): each row is its own
   engine request. preprocessing (BLS) runs for every row first; an error there ends the client's
   request with that error before anything is generated.
3. one engine request per row on the engine channel (engine_channel/protocol.py); num_return_sequences
   > 1 asks for that many sequences of the row's prompt (they share its KV blocks in the engine).
4. every output frame -> postprocessing (BLS) -> the client, with `batch_index` (B > 1),
   `sequence_index` (n > 1), `num_input_tokens` / `num_output_tokens` and the perf metrics when
   asked. The response that ends the last sequence of the last row carries the FINAL flag
   (non-streamed, B = 1, n = 1: the only response, so HTTP generate gets exactly one).
A watcher thread polls `is_cancelled()` of the client requests in flight every `poll_s`; on
cancellation it sends `abort` on their engine requests' connections (the llm instance frees their KV
blocks before its next step and ends them); a row whose engine request has not ended `give_up_s`
after that is closed (closing the connection aborts it too). Responses of a cancelled request are
not sent. A row whose engine request fails ends the client's request with the error and stops the
other rows; an llm instance that goes away mid-request ends it with UNAVAILABLE naming the
instance, and a request that finds no instance serving is refused with UNAVAILABLE.
Errors keep Triton's ensemble wording: "in ensemble '<name>', <message of the step>".
The state of a request in flight and the response helpers are in requests.py; the BLS steps
(preprocessing, postprocessing) and the tensors of one row in steps.py.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import numpy as np

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_triton.engine_channel import protocol
from paddle_llm_triton.lifecycle.drain import DrainingError
from paddle_llm_triton.engine_channel.client import ChannelClient, ChannelClosed, ChannelUnavailable
from paddle_llm_triton.ensemble import steps
from paddle_llm_triton.ensemble.requests import ClientRequest, Flight, Row, StepError, batch_row, ensemble_response
from paddle_llm_triton.errors import triton_code
from paddle_llm_triton.contracts.timeout import timeout_us
from paddle_llm_triton.lifecycle.senders import SenderLedger

log = logging.getLogger(__name__)

def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


class EnsemblePipeline:
    """The `ensemble` model's work: submit() hands each client request to its own thread (module doc).

    name / preprocessing / llm / postprocessing: the model names; poll_s: seconds between cancellation
    checks; give_up_s: seconds after an abort before a row's connection is closed; channel: the engine
    channel client (default: one to the `llm` instances); coalesce: merge the frames a row fell behind on."""

    def __init__(self, name: str = "ensemble", preprocessing: str = "preprocessing", llm: str = "llm",
                 postprocessing: str = "postprocessing", poll_s: float = 0.1, give_up_s: float = 30.0,
                 channel: ChannelClient | None = None, coalesce: bool = True):
        self.name = name
        self.pre_model, self.llm_model, self.post_model = preprocessing, llm, postprocessing
        self.poll_s, self.give_up_s = poll_s, give_up_s
        self.coalesce = coalesce  # a row that fell behind: its arrived frames in one response
        self.channel = channel or ChannelClient(llm)
        self.drain = None  # a drain.Drain set by the model: refuses new requests while draining
        self.senders = SenderLedger()  # every client's response sender until its FINAL
        self._in_flight = 0  # client requests handed to their thread and not answered to the end
        self._flights: dict[str, Flight] = {}
        self._lora_homes: dict[int, str] = {}  # LoRA task id -> the llm instance that cached it last
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="ensemble-cancel-watcher", daemon=True)
        self._watcher.start()

    # -- entry ------------------------------------------------------------------------------------
    def submit(self, request) -> None:
        """execute(): hand the request to its own thread and return at once."""
        with self._lock:
            self._in_flight += 1
        threading.Thread(target=self._run, args=(request,), name="ensemble-request", daemon=True).start()

    def attach_lifecycle(self, model_name: str, instance_name: str):
        """The launcher's drain for this model instance (refuse new requests, let those in flight
        finish) and its control bus; returns the ControlBus, which the model closes in finalize()."""
        from paddle_llm_triton.engine_channel.control_bus import ControlBus
        from paddle_llm_triton.lifecycle.drain import Drain

        drain = Drain(model_name, instance_name, lambda: max(self.in_flight, self.senders.open),
                      open_responses=self.senders.open_by_kind)
        self.drain = drain
        return ControlBus(model_name, instance_name, {"drain": drain.on_drain, "status": drain.status})

    @property
    def in_flight(self) -> int:
        """Client requests not answered to their final response yet."""
        return self._in_flight

    def shutdown(self) -> None:
        """Stop the engine requests in flight (the server is going away) and the cancellation watcher."""
        self._stopping.set()
        with self._lock:
            flights = list(self._flights.values())
        for f in flights:  # the server is going away: do not leave the engine generating
            self._stop_flight(f)
        self._watcher.join(5)

    # -- one request ------------------------------------------------------------------------------
    def _run(self, request) -> None:
        pb = _pb()
        try:
            sender = self.senders.track(request.get_response_sender(), "ensemble")
            try:
                stop = pb.get_input_tensor_by_name(request, "stop")
                if stop is not None and bool(stop.as_numpy().reshape(-1).any()):
                    self._client_stop(request, sender)
                    return
                if self.drain is not None:
                    self.drain.refuse_if_draining()
                self._generate(request, sender)
            except StepError as e:
                self._send_error(sender, str(e), e.code)
            except DrainingError as e:
                self._send_error(sender, str(e), pb.TritonError.UNAVAILABLE)
            except InvalidRequestError as e:  # e.g. a malformed `timeout` request parameter
                self._send_error(sender, str(e), pb.TritonError.INVALID_ARG)
            except Exception as e:  # a bug here must still end the client's request
                log.exception("ensemble request failed")
                self._send_error(sender, f"{type(e).__name__}: {e}", pb.TritonError.INTERNAL)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _rows(self, request) -> tuple[list[Row], int]:
        """The request's rows through preprocessing, and its batch size B. Raises StepError or
        InvalidRequestError naming the input."""
        tensors = {t.name(): t.as_numpy() for t in request.inputs()}
        steps.reject_unsupported(tensors)
        if "text_input" not in tensors:  # optional in config.pbtxt only so that `stop` may come without it
            raise InvalidRequestError("text_input", "required: the prompt (a `stop` request alone may omit it)")
        batch = tensors["text_input"].shape[0] if tensors["text_input"].ndim >= 2 else 1
        return [steps.preprocess(self.pre_model, b, {k: batch_row(v, b, batch) for k, v in tensors.items()})
                for b in range(batch)], batch

    def _frame_response(self, client: ClientRequest, r: Row, frame: dict, batched: bool):
        """The client's response for one output frame: postprocessing, then TensorRT-LLM's outputs.
        Raises StepError when a step fails."""
        tensors = steps.postprocess(self.post_model, frame) + steps.extra_outputs(r, frame, batched)
        return ensemble_response(tensors, str(frame.get("finish_reason") or ""))

    def _generate(self, request, sender) -> None:
        rows, batch = self._rows(request)
        client = ClientRequest(request.request_id(), sender, remaining=sum(r.n for r in rows),
                               timeout_us=timeout_us(request))  # the engine enforces it (llm's request.timeout())
        flights = []
        for r in rows:
            f = Flight(client, uuid.uuid4().hex)
            flights.append((f, r))
        client.flights = [f for f, _ in flights]
        client.live_flights = len(flights)
        with self._lock:
            for f, _ in flights:
                self._flights[f.inner_id] = f
        threads = [threading.Thread(target=self._stream_row, args=(f, r, batch > 1), daemon=True,
                                    name="ensemble-row") for f, r in flights[1:]]
        for t in threads:
            t.start()
        try:
            self._stream_row(*flights[0], batch > 1)
        finally:
            for t in threads:
                t.join()
            # A client request and its rows refer to each other: undo that now that every row has
            # ended, so that the response sender is released here and not by the garbage collector,
            # which may run only at the stub's exit, after the stub the sender's clean-up needs is
            # gone (a segmentation fault at every unload of `ensemble` that had served requests).
            for f in client.flights:
                f.stream = None
            client.flights = []

    def _stream_row(self, f: Flight, r: Row, batched: bool) -> None:
        """Relay one row's engine outputs to the client (on its own thread for rows after the first)."""
        pb = _pb()
        client = f.client
        try:
            f.stream = self.channel.open(steps.engine_request(f, r), prefer=self._lora_home(r))
            self._lora_home(r, f.stream.instance)
            if client.cancelled:  # the watcher saw the cancellation before the stream existed
                self._stop_flight(f)
            ahead = None  # a frame read while coalescing that did not merge: the next to handle
            while True:
                try:
                    frame, ahead = (ahead, None) if ahead is not None else (f.stream.next(timeout=self.poll_s * 10), None)
                    if self.coalesce:
                        frame, ahead = self._coalesce(f.stream, frame)
                except TimeoutError:
                    if f.first_stop_at is not None and time.monotonic() - f.first_stop_at > self.give_up_s:
                        log.error("%s: engine request %s on %s still running %.0f s after its client cancelled; "
                                  "closing its connection", self.name, f.inner_id, f.stream.instance, self.give_up_s)
                        f.stream.close()
                        break
                    continue
                if frame.get("type") == "error":
                    self._fail(client, str(frame.get("message")), triton_code(frame.get("code")))
                    break
                if not (client.cancelled or client.done):  # else nobody listens: read to the end
                    try:
                        response = self._frame_response(client, r, frame, batched)
                    except StepError as e:
                        self._fail(client, str(e), e.code)
                    else:
                        client.send(response, ends_sequence=bool(frame.get("seq_finished")))
                if frame.get("finished"):
                    break
        except ChannelUnavailable as e:
            self._fail(client, f"{self.llm_model}: {e}", pb.TritonError.UNAVAILABLE)
        except ChannelClosed as e:
            if not client.cancelled:
                log.error("%s: engine request %s: %s", self.name, f.inner_id, e)
            self._fail(client, str(e), pb.TritonError.UNAVAILABLE)
        except Exception as e:  # a bug here must still end the client's request, with the reason
            log.exception("%s: engine request %s failed", self.name, f.inner_id)
            try:
                self._fail(client, f"{type(e).__name__}: {e}", pb.TritonError.INTERNAL)
            except Exception:
                pass
        finally:
            self._end_flight(f)

    def _lora_home(self, r: Row, instance: str | None = None) -> str | None:
        """The llm instance that last served row r's LoRA task (its cache holds the task's weights);
        with `instance`, record it. None without a task."""
        task = (r.lora or {}).get("task_id")
        if task is None:
            return None
        with self._lock:
            if instance is None:
                return self._lora_homes.get(task)
            self._lora_homes.pop(task, None)
            self._lora_homes[task] = instance
            while len(self._lora_homes) > 4096:  # oldest first (dicts keep insertion order)
                self._lora_homes.pop(next(iter(self._lora_homes)))
        return instance

    @staticmethod
    def _coalesce(stream, frame: dict) -> tuple[dict, dict | None]:
        """`frame` merged with the frames of its sequence that have already arrived (a stream the
        client side fell behind on: one postprocessing call and one response for all of them, as
        `llm`'s responder does); returns (frame, the first arrived frame that did not merge or None)."""
        while not (frame.get("finished") or frame.get("seq_finished") or frame.get("type") != "output"):
            nxt = stream.take_ready()
            if nxt is None:
                return frame, None
            merged = protocol.merge_output_frames(frame, nxt)
            if merged is None:
                return frame, nxt
            frame = merged
        return frame, None

    def _end_flight(self, f: Flight) -> None:
        """A row's engine request is over: close its stream, forget it, and send the client's final
        response when it was the client's last row."""
        client = f.client
        if f.stream is not None:
            f.stream.close()
        f.ended = True
        with self._lock:
            self._flights.pop(f.inner_id, None)
        with client.lock:
            client.live_flights -= 1
            last = client.live_flights == 0
        if last:
            try:
                client.send(None, final=True)  # no-op when the final response is out
            except Exception:  # the client is gone
                pass
        if client.cancelled:
            log.info("%s: request %r cancelled by the client; engine request %s ended %.2f s after the "
                     "abort", self.name, client.client_id, f.inner_id,
                     time.monotonic() - (f.first_stop_at or time.monotonic()))

    def _fail(self, client: ClientRequest, message: str, code) -> None:
        """End the client's request with an error and stop its other rows."""
        pb = _pb()
        if client.send(pb.InferenceResponse(error=pb.TritonError(self._error_text(message), code)), final=True):
            for f in client.flights:
                if not f.ended:
                    self._stop_flight(f)

    def _client_stop(self, request, sender) -> None:
        """TensorRT-LLM stop signal: stop this model's requests in flight under the same request id."""
        pb = _pb()
        cid = request.request_id()
        if not cid:
            raise StepError("stop: a stop request needs the request id of the request to stop "
                             "(send it with the same request id)", pb.TritonError.INVALID_ARG)
        with self._lock:
            targets = [f for f in self._flights.values() if f.client.client_id == cid]
        for f in targets:
            self._stop_flight(f)
        log.info("%s: stop request for id %r: %d request(s) stopped", self.name, cid, len(targets))
        sender.send(ensemble_response([
            pb.Tensor("text_output", np.array([b""], dtype=np.object_)),
            pb.Tensor("cum_log_probs", np.zeros(1, np.float32)),
            pb.Tensor("output_log_probs", np.zeros(0, np.float32))]),
            flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    # -- cancellation -----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s):
            self._sweep()

    def _sweep(self) -> None:
        """One cancellation check of every client request in flight. A method of its own so that
        its locals die when it returns: a loop variable left bound in the watcher's frame (invisible
        to the garbage collector) kept the last client request, and with it its response sender,
        alive until the next sweep that saw a request, possibly until the stub's exit."""
        with self._lock:
            flights = list(self._flights.values())
        for client in {id(f.client): f.client for f in flights}.values():
            try:
                if client.poll_cancelled():
                    log.info("%s: request %r cancelled by the client: aborting its engine request(s) %s",
                             self.name, client.client_id, ", ".join(f.inner_id for f in client.flights))
                    for f in client.flights:
                        if not f.ended:
                            self._stop_flight(f)
            except Exception:
                log.exception("cancellation check failed")

    def _stop_flight(self, f: Flight) -> None:
        """Abort one engine request: an `abort` frame on its connection (the llm instance ends it
        with its last frames; the row thread closes the connection after `give_up_s` if not)."""
        f.first_stop_at = f.first_stop_at or time.monotonic()
        if f.stream is not None:
            f.stream.cancel()

    def _error_text(self, message: str) -> str:
        return message if message.startswith("in ensemble ") else f"in ensemble '{self.name}', {message}"

    def _send_error(self, sender, message: str, code) -> None:
        """Error on a request that has no llm request in flight."""
        pb = _pb()
        msg = self._error_text(message)
        try:
            sender.send(pb.InferenceResponse(error=pb.TritonError(msg, code)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            log.warning("could not send the error of a request (client gone?): %s", msg)
