"""Ensemble step 3: shape one `llm` response into the TensorRT-LLM outputs.

Text arrives already detokenized: the engine detokenizes incrementally per request (it needs the
text for stop strings), so every delta is whole UTF-8 with its word-boundary spaces. Triton forbids
a step that mixes inputs from a decoupled model with inputs from another model, so everything this
step needs comes from the `llm` response itself (prompt prefix and logprob zeroing included)."""

import numpy as np
import triton_python_backend_utils as pb_utils

from paddle_llm_triton import tensors as T


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = T.get_str(request, "TEXT_DELTA") or ""
            lps = T.get_array(request, "OUTPUT_LOG_PROBS")
            lps = np.zeros(0, np.float32) if lps is None else lps.reshape(-1).astype(np.float32)
            cum = T.get_array(request, "CUM_LOG_PROB")
            cum = float(cum.reshape(-1)[0]) if cum is not None and cum.size else 0.0
            out = [
                pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
                pb_utils.Tensor("cum_log_probs", np.array([cum], dtype=np.float32)),
                pb_utils.Tensor("output_log_probs", lps),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
