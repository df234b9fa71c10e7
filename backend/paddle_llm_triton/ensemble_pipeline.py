"""The `ensemble` model as a decoupled Python (BLS) model: preprocessing -> llm -> postprocessing,
called from here, so that client cancellation reaches the engine.

Why not a Triton ensemble: Triton 2.51 does not pass a client's cancellation into the steps of an
ensemble, so `llm` would never learn that the client left and its request would run to the end.
This model is the request the client talks to, so its own `response_sender.is_cancelled()` turns
true when the client cancels (gRPC stop_stream(cancel_requests=True)) or drops the connection
(gRPC or HTTP generate_stream). The 2.51 Python backend has no way to cancel an in-flight BLS
request (its ResponseIterator has no cancel()), so the abort travels as a request of its own: a
`stop` request to `llm` carrying the inner request's id (stop_requests.py aborts it on
whichever `llm` instance runs it).

Per client request (one thread each; the engine's own threads do the heavy work):
1. `stop` = true: TensorRT-LLM's stop signal. Every request of this model in flight under the same
   client request id is stopped as in 4; the stop request itself gets one empty final response.
2. preprocessing (BLS) with the client's tensors; an error ends the request with that error.
3. llm (decoupled BLS) under a fresh unique request id, asking for finish_reason so that the last
   response is known when it arrives.
4. every llm response -> postprocessing (BLS) -> the client; the one with a finish_reason is sent
   with the FINAL flag (non-streamed: the only response, so HTTP generate gets exactly one).
A watcher thread polls `is_cancelled()` of the requests in flight every `poll_s`; on cancellation
it sends the stop to `llm` and repeats it every `retry_s` until the inner stream ends (a stop can
overtake its request on the way into `llm`), for at most `give_up_s`. Responses of a cancelled
request are not sent.
Every llm request carries ensemble_protocol.ENSEMBLE_STEP: llm then answers by the internal protocol
described there (token ids in, TensorRT-LLM logprob outputs, a failure of a started request as an
`error` output because Triton 2.51's BLS iterator loses error responses that follow data
responses); this model turns that output into a Triton error for the client.
Errors keep Triton's ensemble wording: "in ensemble '<name>', <message of the step>".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from paddle_llm_triton import ensemble_protocol as protocol
from paddle_llm_triton.errors import triton_code

log = logging.getLogger(__name__)

# inputs of `ensemble` that preprocessing takes (everything but `stop`)
PRE_INPUTS = ("text_input", "max_tokens", "stream", "stop_words", "bad_words", "end_id", "pad_id", "top_k",
              "top_p", "temperature", "repetition_penalty", "presence_penalty", "frequency_penalty",
              "length_penalty", "min_tokens", "min_length", "seed", "random_seed", "exclude_input_in_output",
              "return_log_probs", "beam_width", "num_return_sequences", "apply_chat_template",
              "guided_decoding_guide_type", "guided_decoding_guide")
PRE_OUTPUTS = ["INPUT_IDS", "SAMPLING_PARAMETERS", "STREAM", "EXCLUDE_INPUT_IN_OUTPUT", "RETURN_LOG_PROBS"]
POST_OUTPUTS = ["text_output", "cum_log_probs", "output_log_probs"]


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


@dataclass
class _Flight:
    """One client request whose llm request is in flight.

    Every use of `sender` holds `lock`, and nothing touches it after the FINAL send (`done`): in
    Triton 2.51, is_cancelled() on a sender whose final response is already out crashed
    tritonserver (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled), and the watcher thread
    polls while the request thread sends."""

    client_id: str
    inner_id: str
    sender: object
    cancelled: bool = False
    done: bool = False
    stop_sent_at: float | None = None   # last stop sent to llm
    first_stop_at: float | None = None
    gave_up: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, response=None, final: bool = False) -> bool:
        """Send unless the final response is out; False when nothing was sent."""
        pb = _pb()
        with self.lock:
            if self.done:
                return False
            self.done = final
            self.sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
            return True

    def poll_cancelled(self) -> bool:
        """True the first time the client's cancellation is seen (never after the final send)."""
        with self.lock:
            if self.done or self.cancelled:
                return False
            self.cancelled = bool(self.sender.is_cancelled())
            return self.cancelled


class _StepError(Exception):
    def __init__(self, message: str, code):
        super().__init__(message)
        self.code = code


class EnsemblePipeline:
    def __init__(self, name: str = "ensemble", preprocessing: str = "preprocessing", llm: str = "llm",
                 postprocessing: str = "postprocessing", poll_s: float = 0.1, retry_s: float = 1.0,
                 give_up_s: float = 30.0):
        self.name = name
        self.pre_model, self.llm_model, self.post_model = preprocessing, llm, postprocessing
        self.poll_s, self.retry_s, self.give_up_s = poll_s, retry_s, give_up_s
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="ensemble-cancel-watcher", daemon=True)
        self._watcher.start()

    # -- entry ------------------------------------------------------------------------------------
    def submit(self, request) -> None:
        """execute(): hand the request to its own thread and return at once."""
        threading.Thread(target=self._run, args=(request,), name="ensemble-request", daemon=True).start()

    def shutdown(self) -> None:
        self._stopping.set()
        with self._lock:
            flights = list(self._flights.values())
        for f in flights:  # the server is going away: do not leave the engine generating
            self._send_stop(f.inner_id)
        self._watcher.join(5)

    # -- one request ------------------------------------------------------------------------------
    def _run(self, request) -> None:
        pb = _pb()
        sender = request.get_response_sender()
        try:
            stop = pb.get_input_tensor_by_name(request, "stop")
            if stop is not None and bool(stop.as_numpy().reshape(-1)[0]):
                self._client_stop(request, sender)
                return
            self._generate(request, sender)
        except _StepError as e:
            self._send_error(sender, str(e), e.code)
        except Exception as e:  # a bug here must still end the client's request
            log.exception("ensemble request failed")
            self._send_error(sender, f"{type(e).__name__}: {e}", pb.TritonError.INTERNAL)

    def _generate(self, request, sender) -> None:
        pb = _pb()
        inputs = [t for t in request.inputs() if t.name() in PRE_INPUTS]
        pre = self._exec(pb.InferenceRequest(model_name=self.pre_model, inputs=inputs,
                                             requested_output_names=PRE_OUTPUTS))
        pre_out = {n: pb.get_output_tensor_by_name(pre, n).as_numpy() for n in PRE_OUTPUTS}
        text = pb.get_input_tensor_by_name(request, "text_input").as_numpy()
        inner_id = uuid.uuid4().hex
        llm_req = pb.InferenceRequest(
            model_name=self.llm_model, request_id=inner_id, requested_output_names=list(protocol.LLM_OUTPUTS),
            inputs=[pb.Tensor(protocol.ENSEMBLE_STEP, np.array([True])),
                    pb.Tensor(protocol.INPUT_IDS, pre_out["INPUT_IDS"].reshape(-1).astype(np.int32)),
                    pb.Tensor("sampling_parameters", pre_out["SAMPLING_PARAMETERS"].reshape(1)),
                    pb.Tensor("stream", pre_out["STREAM"].reshape(1)),
                    pb.Tensor("text_input", text.reshape(1)),
                    pb.Tensor("exclude_input_in_output", pre_out["EXCLUDE_INPUT_IN_OUTPUT"].reshape(1)),
                    pb.Tensor("return_logprobs", pre_out["RETURN_LOG_PROBS"].reshape(1)),
                    pb.Tensor("return_finish_reason", np.array([True]))])
        flight = _Flight(request.request_id(), inner_id, sender)
        with self._lock:
            self._flights[inner_id] = flight
        try:
            for resp in llm_req.exec(decoupled=True):
                if resp.has_error():
                    # an error is the last response of the llm request (2.51's iterator does not
                    # always end after it: do not wait for more)
                    err = resp.error()
                    flight.send(pb.InferenceResponse(error=pb.TritonError(self._error_text(err.message()), _code(err))),
                                final=True)
                    break
                if flight.cancelled or flight.done:
                    continue  # nobody is listening any more: drain to the end of the inner stream
                out = {n: pb.get_output_tensor_by_name(resp, n) for n in protocol.LLM_OUTPUTS}
                if out[protocol.ERROR] is not None:  # llm failed the request after it started
                    message, code = protocol.decode_error(out[protocol.ERROR].as_numpy().reshape(-1)[0])
                    flight.send(pb.InferenceResponse(error=pb.TritonError(self._error_text(message), triton_code(code))),
                                final=True)
                    break
                if out["text_output"] is None:
                    continue  # an empty final response
                reason = out["finish_reason"]
                last = reason is not None and reason.as_numpy().reshape(-1)[0] not in (b"", "")
                try:
                    post = self._post(out)
                except _StepError as e:
                    flight.send(pb.InferenceResponse(error=pb.TritonError(self._error_text(str(e)), e.code)), final=True)
                    continue
                flight.send(_response(post), final=last)
        except Exception as e:  # the inner stream broke: end the client's request with the reason
            log.exception("%s: llm request %s failed", self.name, inner_id)
            try:
                flight.send(pb.InferenceResponse(error=pb.TritonError(self._error_text(f"{type(e).__name__}: {e}"),
                                                                      pb.TritonError.INTERNAL)), final=True)
            except Exception:
                pass
        finally:
            with self._lock:
                self._flights.pop(inner_id, None)
            try:
                flight.send(None, final=True)  # no-op when the final response is out
            except Exception:  # the client is gone
                pass
            if flight.cancelled:
                log.info("%s: request %r cancelled by the client; llm request %s ended %.2f s after the "
                         "first stop", self.name, flight.client_id, inner_id,
                         time.monotonic() - (flight.stop_sent_at or time.monotonic()))

    def _post(self, out: dict) -> list:
        pb = _pb()
        text = out["text_output"].as_numpy().reshape(1, -1)[:, :1]
        lps = out["output_log_probs"]
        lps = np.zeros((1, 0), np.float32) if lps is None else lps.as_numpy().astype(np.float32).reshape(1, -1)
        cum = out["cumulative_logprob"]
        cum = np.zeros((1, 1), np.float32) if cum is None else cum.as_numpy().astype(np.float32).reshape(1, 1)
        resp = self._exec(pb.InferenceRequest(
            model_name=self.post_model, requested_output_names=POST_OUTPUTS,
            inputs=[pb.Tensor("TEXT_DELTA", text), pb.Tensor("OUTPUT_LOG_PROBS", lps), pb.Tensor("CUM_LOG_PROB", cum)]))
        return [pb.Tensor(n, pb.get_output_tensor_by_name(resp, n).as_numpy()) for n in POST_OUTPUTS]

    def _client_stop(self, request, sender) -> None:
        """TensorRT-LLM stop signal: stop this model's requests in flight under the same request id."""
        pb = _pb()
        cid = request.request_id()
        if not cid:
            raise _StepError("stop: a stop request needs the request id of the request to stop "
                             "(send it with the same request id)", pb.TritonError.INVALID_ARG)
        with self._lock:
            targets = [f for f in self._flights.values() if f.client_id == cid]
        for f in targets:
            f.stop_sent_at = f.stop_sent_at or time.monotonic()
            self._send_stop(f.inner_id)
        log.info("%s: stop request for id %r: %d request(s) stopped", self.name, cid, len(targets))
        sender.send(_response([
            pb.Tensor("text_output", np.array([b""], dtype=np.object_)),
            pb.Tensor("cum_log_probs", np.zeros(1, np.float32)),
            pb.Tensor("output_log_probs", np.zeros(0, np.float32))]),
            flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    # -- cancellation -----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s):
            with self._lock:
                flights = list(self._flights.values())
            now = time.monotonic()
            for f in flights:
                try:
                    if f.poll_cancelled():
                        f.stop_sent_at = f.first_stop_at = now
                        log.info("%s: request %r cancelled by the client: stopping llm request %s",
                                 self.name, f.client_id, f.inner_id)
                        self._send_stop(f.inner_id)
                    elif f.cancelled and not f.gave_up and now - (f.stop_sent_at or now) >= self.retry_s:
                        if now - (f.first_stop_at or now) > self.give_up_s:
                            f.gave_up = True
                            log.error("%s: llm request %s still running %.0f s after its client cancelled; "
                                      "giving up on stopping it", self.name, f.inner_id, now - f.first_stop_at)
                            continue
                        f.stop_sent_at = now  # the inner stream has not ended: the stop may have overtaken it
                        self._send_stop(f.inner_id)
                except Exception:
                    log.exception("cancellation check failed")

    def _send_stop(self, inner_id: str) -> None:
        pb = _pb()
        req = pb.InferenceRequest(model_name=self.llm_model, request_id=inner_id, requested_output_names=["text_output"],
                                  inputs=[pb.Tensor("stop", np.array([True]))])
        try:
            for resp in req.exec(decoupled=True):
                if resp.has_error():
                    log.warning("stop of llm request %s failed: %s", inner_id, resp.error().message())
        except Exception as e:
            log.warning("stop of llm request %s failed: %s", inner_id, e)

    # -- helpers ----------------------------------------------------------------------------------
    def _exec(self, req):
        resp = req.exec()
        if resp.has_error():
            err = resp.error()
            raise _StepError(err.message(), _code(err))
        return resp

    def _error_text(self, message: str) -> str:
        return message if message.startswith("in ensemble ") else f"in ensemble '{self.name}', {message}"

    def _send_error(self, sender, message: str, code) -> None:
        """Error on a request that is not (or no longer) a registered flight."""
        pb = _pb()
        msg = self._error_text(message)
        try:
            sender.send(pb.InferenceResponse(error=pb.TritonError(msg, code)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            log.warning("could not send the error of a request (client gone?): %s", msg)


def _code(err):
    """The TritonError code of a BLS error (INTERNAL when the stub does not expose it)."""
    pb = _pb()
    try:
        return err.code()
    except Exception:
        return pb.TritonError.INTERNAL


# Response parameters a Triton ensemble attaches to every response (HTTP generate shows them as JSON
# fields); sent too so that the JSON clients see stays the same.
_SEQUENCE_PARAMETERS = {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
_parameters_supported: bool | None = None


def _response(tensors: list):
    global _parameters_supported
    pb = _pb()
    if _parameters_supported is not False:
        try:
            r = pb.InferenceResponse(output_tensors=tensors, parameters=_SEQUENCE_PARAMETERS)
            _parameters_supported = True
            return r
        except TypeError:
            _parameters_supported = False
            log.info("this Python backend has no response parameters; sequence_* fields not sent")
    return pb.InferenceResponse(output_tensors=tensors)
