"""The `tensorrt_llm` (llmapi contract) requests: the ensemble's pipeline (ensemble/pipeline.py:
preprocessing by BLS, the engine request on the engine channel to the least loaded `llm` instance,
cancellation by the client's `is_cancelled()`) with the llmapi's inputs and outputs (contract.py).

Differences from `ensemble`, as TensorRT-LLM's llmapi model behaves:
- the outputs come straight from the engine's frames (the llm instance detokenizes), no
  postprocessing step;
- non-decoupled by default: one response per request, sent with the FINAL flag (Triton's ModelInfer,
  HTTP infer / generate); decoupled (config.pbtxt) for `streaming`;
- the `stop` signal ends the stopped request with a CANCELLED error "Request cancelled by client",
  and answers the stop request itself with the same error (whether or not a request was stopped);
- errors are "Error generating request: <message>" as there, not the ensemble's wording.
"""

from __future__ import annotations

import logging

from paddle_llm_triton.ensemble import steps
from paddle_llm_triton.ensemble.pipeline import EnsemblePipeline, _pb
from paddle_llm_triton.ensemble.requests import ClientRequest, Row, StepError
from paddle_llm_triton.llmapi import contract

log = logging.getLogger(__name__)

CANCELLED_TEXT = "Request cancelled by client"


class LLMAPIPipeline(EnsemblePipeline):
    """decoupled: the model's transaction policy (streaming needs it)."""

    def __init__(self, name: str = "tensorrt_llm", decoupled: bool = False, **kw):
        super().__init__(name=name, **kw)
        self.decoupled = decoupled

    def _rows(self, request) -> tuple[list[Row], int]:
        tensors = {t.name(): t.as_numpy() for t in request.inputs()}
        row, flags = contract.preprocessing_row(tensors, self.decoupled)
        lora = contract.lora_request(tensors)
        try:
            r = steps.preprocess(self.pre_model, 0, row)
        except StepError as e:
            raise StepError(contract.rename_error(str(e)), e.code) from None
        r.lora = lora
        r.perf = flags["perf"]
        r.llmapi_flags = flags  # what the client asked to get back (contract.output_arrays)
        return [r], 1

    def _frame_response(self, client: ClientRequest, r: Row, frame: dict, batched: bool):
        pb = _pb()
        if getattr(client, "stopped", False) and str(frame.get("finish_reason") or "") == "abort":
            return pb.InferenceResponse(error=pb.TritonError(CANCELLED_TEXT, pb.TritonError.CANCELLED))
        arrays = contract.output_arrays(frame, r.llmapi_flags)
        return pb.InferenceResponse(output_tensors=[pb.Tensor(k, v) for k, v in arrays.items()])

    def _client_stop(self, request, sender) -> None:
        pb = _pb()
        cid = request.request_id()
        if not cid:
            raise StepError("A request id must be provided for request cancellation", pb.TritonError.INVALID_ARG)
        with self._lock:
            targets = [f for f in self._flights.values() if f.client.client_id == cid]
        for f in targets:
            f.client.stopped = True  # its aborted end is answered with CANCELLED (_frame_response)
            self._stop_flight(f)
        log.info("%s: stop request for id %r: %d request(s) stopped", self.name, cid, len(targets))
        sender.send(pb.InferenceResponse(error=pb.TritonError(CANCELLED_TEXT, pb.TritonError.CANCELLED)),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _error_text(self, message: str) -> str:
        return message if message.startswith("Error generating request: ") else f"Error generating request: {message}"
