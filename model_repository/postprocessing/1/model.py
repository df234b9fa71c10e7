"""Ensemble step 3: shape one engine output into the TensorRT-LLM outputs.

The ensemble pipeline (paddle_llm_triton/ensemble/pipeline.py) calls this model by BLS for every
output frame an `llm` instance sends on the engine channel, with the frame's text delta
(TEXT_DELTA), the new tokens' logprobs (OUTPUT_LOG_PROBS) and the cumulative logprob
(CUM_LOG_PROB). Text arrives already detokenized: the engine detokenizes incrementally per request
(it needs the text for stop strings), so every delta is whole UTF-8 with its word-boundary spaces,
and the prompt prefix of a non-streamed answer is already in it (paddle_llm_triton/llm/delta_buffer.py)."""

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
