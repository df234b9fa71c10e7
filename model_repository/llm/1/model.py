"""Triton decoupled model `llm`: hosts one Paddle LLM engine per model instance.

Contract: Triton's vLLM backend (text_input, stream, sampling_parameters JSON, the return_* flags;
parsed and answered by paddle_llm_triton/llm/vllm_request.py) plus TensorRT-LLM's `stop`: a request
with stop = true aborts the requests in flight under the same Triton request id, on every instance
(paddle_llm_triton/llm/stop_requests.py); and `lora_admin`, the runtime LoRA loads and unloads of
every instance (paddle_llm_triton/llm/lora_admin.py). The instance itself (engine, engine loop, responder,
channel, drain, control bus, watchdog, metrics) is a paddle_llm_triton/llm/instance.py LLMInstance;
execute() only parses and enqueues, and answers what it refuses. The `ensemble` model's requests do
not come through Triton: they arrive on this instance's engine channel (paddle_llm_triton/engine_channel/,
served by paddle_llm_triton/llm/ensemble_steps.py), which never calls pb_utils.
"""

import json
import logging

import triton_python_backend_utils as pb_utils

import numpy as np

from paddle_llm_engine import EngineBusyError, EngineDeadError, InvalidRequestError
from paddle_llm_triton import tensors as T
from paddle_llm_triton.lifecycle.drain import DrainingError
from paddle_llm_triton.llm.lora_admin import ADMIN_INPUT
from paddle_llm_triton.llm.instance import LLMInstance

log = logging.getLogger("llm")


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("model `llm` must use the decoupled transaction policy")
        self.llm = LLMInstance(args, model_config)

    def is_ready(self) -> bool:
        """Model readiness (Triton >= 2.67 calls this on /v2/models/llm/ready; 2.51 never does): ready
        while the engine serves, not ready once it failed (the llm_engine_healthy gauge says the same)."""
        llm = getattr(self, "llm", None)
        return llm is not None and llm.healthy

    def execute(self, requests):
        for request in requests:
            sender = self.llm.senders.track(request.get_response_sender(), "llm")
            try:
                admin = T.get_str(request, ADMIN_INPUT)
                if admin is not None:  # a runtime LoRA load / unload / list (llm/lora_admin.py)
                    self.llm.lora_admin.handle(admin, self._admin_reply_to(sender))
                elif T.get_bool(request, "stop"):
                    self._stop(request, sender)
                else:
                    self.llm.submit(request, sender)
            except Exception as e:  # refused: one final error response, the instance keeps serving
                self._refuse(sender, e)
        return None

    def _refuse(self, sender, e: Exception):
        """Answer a refused request: bad input INVALID_ARG; draining (retry elsewhere) and a full
        waiting queue (nothing queued) UNAVAILABLE; a failed engine or anything unexpected INTERNAL."""
        E = pb_utils.TritonError
        if isinstance(e, InvalidRequestError):
            reason, text, code = "invalid", str(e), E.INVALID_ARG
        elif isinstance(e, (DrainingError, EngineBusyError)):
            reason, text, code = ("draining" if isinstance(e, DrainingError) else "queue_full"), str(e), E.UNAVAILABLE
        elif isinstance(e, EngineDeadError):  # fail fast, naming the original failure
            reason, text, code = "not_serving", f"llm instance {self.llm.name} is not serving: {e}", E.INTERNAL
        else:
            log.exception("request rejected")
            reason, text, code = "internal", f"{type(e).__name__}: {e}", E.INTERNAL
        self.llm.metrics.on_rejected(reason)
        sender.send(pb_utils.InferenceResponse(error=E(text, code)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def _admin_reply_to(sender):
        """reply(result, error) of a lora_admin request, its one response: the result as JSON in
        text_output, or the error (INVALID_ARG for a bad request, NOT_FOUND for an adapter or folder
        that is not there, INTERNAL for a refusal or a failed fan-out; "<field>: <reason>" either way)."""
        E = pb_utils.TritonError
        codes = {"invalid": E.INVALID_ARG, "not_found": getattr(E, "NOT_FOUND", E.INVALID_ARG)}

        def reply(result, error):
            if error is None:
                out = pb_utils.Tensor("text_output", np.array([json.dumps(result).encode()], dtype=np.object_))
                response = pb_utils.InferenceResponse(output_tensors=[out])
            else:
                response = pb_utils.InferenceResponse(error=E(str(error), codes.get(error.kind, E.INTERNAL)))
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        return reply

    def _stop(self, request, sender):
        """TensorRT-LLM `stop`: abort the requests in flight under this request's id; answer at once."""
        tid = request.request_id()
        if not tid:
            raise InvalidRequestError("stop", "a stop request needs the request id of the request to stop "
                                              "(send it with the same request id)")
        self.llm.stop(tid)
        sender.send(pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([b""], dtype=np.object_))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        self.llm.close()
