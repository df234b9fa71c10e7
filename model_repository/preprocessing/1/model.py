"""Ensemble step 1: text -> token ids, and the TensorRT-LLM parameter tensors -> one validated
sampling_parameters JSON for the engine request the ensemble pipeline sends to an `llm` instance
(the rules: paddle_llm_triton/contracts/trtllm.py). Bad values fail here with INVALID_ARG naming
the tensor, before any engine sees the request."""

import json
import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from paddle_llm_engine import InvalidRequestError, ModelConfig
from paddle_llm_engine.tokenizer import check_prompt_bytes, encode_prompt, load_tokenizer
from paddle_llm_triton import tensors as T
from paddle_llm_triton.config_params import resolve_model_dir
from paddle_llm_triton.contracts import trtllm
from paddle_llm_triton.contracts.vllm import to_json

log = logging.getLogger("preprocessing")


class TritonPythonModel:
    def initialize(self, args):
        model_dir = resolve_model_dir(json.loads(args["model_config"]))
        self.tokenizer = load_tokenizer(model_dir)
        model = ModelConfig.from_dir(model_dir)
        self.vocab_size = model.vocab_size  # the engine's bound (config.json)
        # no engine's max_model_len can exceed it: a prompt that cannot fit is refused untokenized
        self.max_position_embeddings = model.max_position_embeddings

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except InvalidRequestError as e:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG)))
        return responses

    def _one(self, request):
        text = T.get_str(request, "text_input")
        if text is None or text == "":
            raise InvalidRequestError("text_input", "required and must not be empty")
        params = trtllm.from_trtllm_tensors(trtllm.tensor_values(request), self.vocab_size)
        check_prompt_bytes(self.tokenizer, text, self.max_position_embeddings, field="text_input",
                           limit_name="max_position_embeddings")
        ids = encode_prompt(self.tokenizer, text, chat=bool(T.get_bool(request, "apply_chat_template")))
        if not ids:
            raise InvalidRequestError("text_input", "tokenizes to 0 tokens")
        stream = bool(T.get_bool(request, "stream"))
        exclude = bool(T.get_bool(request, "exclude_input_in_output"))
        want_lp = bool(T.get_bool(request, "return_log_probs"))
        out = [
            pb_utils.Tensor("INPUT_IDS", np.asarray(ids, dtype=np.int32)),
            pb_utils.Tensor("SAMPLING_PARAMETERS", np.array([to_json(params).encode()], dtype=np.object_)),
            pb_utils.Tensor("STREAM", np.array([stream], dtype=np.bool_)),
            pb_utils.Tensor("EXCLUDE_INPUT_IN_OUTPUT", np.array([exclude], dtype=np.bool_)),
            pb_utils.Tensor("RETURN_LOG_PROBS", np.array([want_lp], dtype=np.bool_)),
        ]
        return pb_utils.InferenceResponse(output_tensors=out)
