"""The `ensemble` model as a decoupled Python (BLS) model: preprocessing -> llm -> postprocessing,
called from here, so that client cancellation reaches the engine.

Why not a Triton ensemble: Triton 2.51 does not pass a client's cancellation into the steps of an
ensemble, so `llm` would never learn that the client left and its request would run to the end.
This model is the request the client talks to, so its own `response_sender.is_cancelled()` turns
true when the client cancels (gRPC stop_stream(cancel_requests=True)) or drops the connection
(gRPC or HTTP generate_stream). The 2.51 Python backend has no way to cancel an in-flight BLS
request (its ResponseIterator has no cancel()), so there the abort travels as a request of its own:
a `stop` request to `llm` carrying the inner request's id (stop_requests.py aborts it on whichever
`llm` instance runs it). Where the iterator has cancel() (Triton >= 2.57), that is used first.

Per client request (one thread each; the engine's own threads do the heavy work):
1. `stop` = true: TensorRT-LLM's stop signal. Every request of this model in flight under the same
   client request id is stopped as in 4; the stop request itself gets one empty final response.
2. The request may carry B rows (inputs shaped [B, 1], max_batch_size >= B): each row is its own
   request to the steps. preprocessing (BLS) runs for every row first; an error there ends the
   client's request with that error before anything is generated.
3. llm (decoupled BLS) per row, under a fresh unique request id, asking for finish_reason so that
   the last response of each sequence is known when it arrives; num_return_sequences > 1 asks llm
   for that many sequences of the row's prompt (they share its KV blocks in the engine).
4. every llm response -> postprocessing (BLS) -> the client, with `batch_index` (B > 1),
   `sequence_index` (n > 1), `num_input_tokens` / `num_output_tokens` and the perf metrics when
   asked. The response that ends the last sequence of the last row carries the FINAL flag
   (non-streamed, B = 1, n = 1: the only response, so HTTP generate gets exactly one).
A watcher thread polls `is_cancelled()` of the client requests in flight every `poll_s`; on
cancellation it cancels their llm requests (the BLS iterator's cancel() where it exists, else a
`stop` to `llm`) and repeats the stop every `retry_s` until the inner stream ends (a stop can
overtake its request on the way into `llm`), for at most `give_up_s`. Responses of a cancelled
request are not sent. A row whose llm request fails ends the client's request with the error and
stops the other rows.
Every llm request carries ensemble_protocol.ENSEMBLE_STEP: llm then answers by the internal protocol
described there (token ids in, TensorRT-LLM logprob outputs, a failure of a started request as an
`error` output because Triton 2.51's BLS iterator loses error responses that follow data
responses); this model turns that output into a Triton error for the client.
Errors keep Triton's ensemble wording: "in ensemble '<name>', <message of the step>".
The state of a request in flight and the response helpers are in ensemble_requests.py.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import numpy as np

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_triton import ensemble_protocol as protocol
from paddle_llm_triton.ensemble_requests import (ClientRequest, Flight, Row, StepError, as_text, batch_row,
                                                 bls_error_code, ensemble_response)
from paddle_llm_triton.errors import triton_code
from paddle_llm_triton.request_timeout import timeout_us

log = logging.getLogger(__name__)

# inputs of `ensemble` that preprocessing takes (the others are read here)
PRE_INPUTS = ("text_input", "max_tokens", "stream", "stop_words", "bad_words", "end_id", "pad_id", "top_k",
              "top_p", "temperature", "repetition_penalty", "presence_penalty", "frequency_penalty",
              "length_penalty", "min_tokens", "min_length", "seed", "random_seed", "exclude_input_in_output",
              "return_log_probs", "beam_width", "num_return_sequences", "apply_chat_template",
              "guided_decoding_guide_type", "guided_decoding_guide")
PRE_OUTPUTS = ["INPUT_IDS", "SAMPLING_PARAMETERS", "STREAM", "EXCLUDE_INPUT_IN_OUTPUT", "RETURN_LOG_PROBS"]
POST_OUTPUTS = ["text_output", "cum_log_probs", "output_log_probs"]

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
    "lora_task_id": "LoRA adapters are not supported",
    "lora_weights": "LoRA adapters are not supported",
    "lora_config": "LoRA adapters are not supported",
}


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


class EnsemblePipeline:
    def __init__(self, name: str = "ensemble", preprocessing: str = "preprocessing", llm: str = "llm",
                 postprocessing: str = "postprocessing", poll_s: float = 0.1, retry_s: float = 1.0,
                 give_up_s: float = 30.0):
        self.name = name
        self.pre_model, self.llm_model, self.post_model = preprocessing, llm, postprocessing
        self.poll_s, self.retry_s, self.give_up_s = poll_s, retry_s, give_up_s
        self._flights: dict[str, Flight] = {}
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
            if stop is not None and bool(stop.as_numpy().reshape(-1).any()):
                self._client_stop(request, sender)
                return
            self._generate(request, sender)
        except StepError as e:
            self._send_error(sender, str(e), e.code)
        except InvalidRequestError as e:  # e.g. a malformed `timeout` request parameter
            self._send_error(sender, str(e), pb.TritonError.INVALID_ARG)
        except Exception as e:  # a bug here must still end the client's request
            log.exception("ensemble request failed")
            self._send_error(sender, f"{type(e).__name__}: {e}", pb.TritonError.INTERNAL)

    def _generate(self, request, sender) -> None:
        pb = _pb()
        tensors = {t.name(): t.as_numpy() for t in request.inputs()}
        self._reject_unsupported(tensors)
        batch = tensors["text_input"].shape[0] if tensors["text_input"].ndim >= 2 else 1
        rows = [self._preprocess(b, {k: batch_row(v, b, batch) for k, v in tensors.items()}) for b in range(batch)]
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
        self._stream_row(*flights[0], batch > 1)
        for t in threads:
            t.join()

    def _reject_unsupported(self, tensors: dict) -> None:
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

    def _preprocess(self, index: int, row: dict) -> Row:
        pb = _pb()
        inputs = [pb.Tensor(n, v) for n, v in row.items() if n in PRE_INPUTS]
        pre = self._exec(pb.InferenceRequest(model_name=self.pre_model, inputs=inputs,
                                             requested_output_names=PRE_OUTPUTS))
        n = row.get("num_return_sequences")  # validated by preprocessing

        def flag(name):
            v = row.get(name)
            return v is not None and bool(v.reshape(-1)[0])

        return Row(index, {k: pb.get_output_tensor_by_name(pre, k).as_numpy() for k in PRE_OUTPUTS},
                    row["text_input"], 1 if n is None else int(n.reshape(-1)[0]), flag("return_perf_metrics"),
                    flag("return_num_input_tokens"), flag("return_num_output_tokens"))

    def _llm_request(self, f: Flight, r: Row):
        pb = _pb()
        pre = r.pre
        inputs = [pb.Tensor(protocol.ENSEMBLE_STEP, np.array([True])),
                  pb.Tensor(protocol.INPUT_IDS, pre["INPUT_IDS"].reshape(-1).astype(np.int32)),
                  pb.Tensor("sampling_parameters", pre["SAMPLING_PARAMETERS"].reshape(1)),
                  pb.Tensor("stream", pre["STREAM"].reshape(1)),
                  pb.Tensor("text_input", r.text.reshape(1)),
                  pb.Tensor("exclude_input_in_output", pre["EXCLUDE_INPUT_IN_OUTPUT"].reshape(1)),
                  pb.Tensor("return_logprobs", pre["RETURN_LOG_PROBS"].reshape(1)),
                  pb.Tensor("return_finish_reason", np.array([True]))]
        if r.n != 1:
            inputs.append(pb.Tensor(protocol.NUM_SEQUENCES, np.array([r.n], dtype=np.int32)))
        if r.perf:
            inputs.append(pb.Tensor(protocol.RETURN_PERF_METRICS, np.array([True])))
        if r.num_input_tokens:
            inputs.append(pb.Tensor("return_num_input_tokens", np.array([True])))
        if r.num_output_tokens:
            inputs.append(pb.Tensor("return_num_output_tokens", np.array([True])))
        return pb.InferenceRequest(model_name=self.llm_model, request_id=f.inner_id, inputs=inputs,
                                   requested_output_names=list(protocol.LLM_OUTPUTS), timeout=f.client.timeout_us)

    def _stream_row(self, f: Flight, r: Row, batched: bool) -> None:
        """Relay one row's llm responses to the client (on its own thread for rows after the first)."""
        pb = _pb()
        client = f.client
        try:
            f.responses = self._llm_request(f, r).exec(decoupled=True)
            if client.cancelled:  # the watcher saw the cancellation before the iterator existed
                self._stop_flight(f)
            for resp in f.responses:
                if resp.has_error():
                    # an error is the last response of the llm request (2.51's iterator does not
                    # always end after it: do not wait for more)
                    err = resp.error()
                    self._fail(client, err.message(), bls_error_code(err))
                    break
                if client.cancelled or client.done:
                    continue  # nobody is listening any more: drain to the end of the inner stream
                out = {n: pb.get_output_tensor_by_name(resp, n) for n in protocol.LLM_OUTPUTS}
                if out[protocol.ERROR] is not None:  # llm failed the request after it started
                    message, code = protocol.decode_error(out[protocol.ERROR].as_numpy().reshape(-1)[0])
                    self._fail(client, message, triton_code(code))
                    break
                if out["text_output"] is None:
                    continue  # an empty final response
                reason = out["finish_reason"]
                reason = "" if reason is None else as_text(reason.as_numpy().reshape(-1)[0])
                try:
                    tensors = self._post(out) + self._extra_outputs(r, out, batched)
                except StepError as e:
                    self._fail(client, str(e), e.code)
                    continue
                client.send(ensemble_response(tensors, reason), ends_sequence=reason != "")
        except Exception as e:  # the inner stream broke: end the client's request with the reason
            log.exception("%s: llm request %s failed", self.name, f.inner_id)
            try:
                self._fail(client, f"{type(e).__name__}: {e}", pb.TritonError.INTERNAL)
            except Exception:
                pass
        finally:
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
                log.info("%s: request %r cancelled by the client; llm request %s ended %.2f s after the "
                         "first stop", self.name, client.client_id, f.inner_id,
                         time.monotonic() - (f.first_stop_at or time.monotonic()))

    def _extra_outputs(self, r: Row, out: dict, batched: bool) -> list:
        """TensorRT-LLM's optional outputs, each [1, 1]: batch_index (B > 1), sequence_index (n > 1),
        num_input_tokens / num_output_tokens and the perf metrics when asked."""
        pb = _pb()
        extra = []
        if batched:
            extra.append(pb.Tensor("batch_index", np.array([[r.index]], dtype=np.int32)))
        if r.n > 1:
            seq = out[protocol.SEQUENCE_INDEX]
            seq = 0 if seq is None else int(seq.as_numpy().reshape(-1)[0])
            extra.append(pb.Tensor("sequence_index", np.array([[seq]], dtype=np.int32)))
        for flag, name in ((r.num_input_tokens, "num_input_tokens"), (r.num_output_tokens, "num_output_tokens")):
            if flag and out[name] is not None:
                extra.append(pb.Tensor(name, out[name].as_numpy().astype(np.int32).reshape(1, 1)))
        if r.perf and out[protocol.PERF_METRICS] is not None:
            values = protocol.decode_perf_metrics(out[protocol.PERF_METRICS].as_numpy().reshape(-1)[0])
            for name, dtype in protocol.PERF_OUTPUTS:
                extra.append(pb.Tensor(name, np.array([[values[name]]], dtype=dtype)))
        return extra

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
            f.stop_sent_at = f.stop_sent_at or time.monotonic()
            self._send_stop(f.inner_id)
        log.info("%s: stop request for id %r: %d request(s) stopped", self.name, cid, len(targets))
        sender.send(ensemble_response([
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
            for client in {id(f.client): f.client for f in flights}.values():
                try:
                    if client.poll_cancelled():
                        log.info("%s: request %r cancelled by the client: stopping its llm request(s) %s",
                                 self.name, client.client_id, ", ".join(f.inner_id for f in client.flights))
                        for f in client.flights:
                            if not f.ended:
                                self._stop_flight(f)
                except Exception:
                    log.exception("cancellation check failed")
            for f in flights:
                try:
                    if f.client.cancelled and not f.ended and not f.gave_up and \
                            now - (f.stop_sent_at or now) >= self.retry_s:
                        if now - (f.first_stop_at or now) > self.give_up_s:
                            f.gave_up = True
                            log.error("%s: llm request %s still running %.0f s after its client cancelled; "
                                      "giving up on stopping it", self.name, f.inner_id, now - f.first_stop_at)
                            continue
                        f.stop_sent_at = now  # the inner stream has not ended: the stop may have overtaken it
                        self._send_stop(f.inner_id)
                except Exception:
                    log.exception("cancellation retry failed")

    def _stop_flight(self, f: Flight) -> None:
        """Stop one llm request: cancel() on its BLS response iterator where this Triton has it
        (>= 2.57: llm sees is_cancelled() and aborts), else a `stop` request with its id."""
        now = time.monotonic()
        f.stop_sent_at = now
        f.first_stop_at = f.first_stop_at or now
        cancel = getattr(f.responses, "cancel", None)
        if cancel is not None:
            try:
                cancel()
                return
            except Exception as e:
                log.warning("cancel() of llm request %s failed (%s); sending a stop", f.inner_id, e)
        self._send_stop(f.inner_id)

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
            raise StepError(err.message(), bls_error_code(err))
        return resp

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
