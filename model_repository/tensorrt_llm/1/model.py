"""Model `tensorrt_llm`: TensorRT-LLM's Python "llmapi" Triton model contract on this engine
(paddle_llm_triton/llmapi/). Not decoupled by default, as there: one response per request; set
model_transaction_policy { decoupled: true } in config.pbtxt for `streaming`. execute() hands each
request to the pipeline and returns at once (the responses go through each request's sender)."""

import gc
import json

import triton_python_backend_utils as pb_utils

from paddle_llm_triton.llmapi.pipeline import LLMAPIPipeline


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
        unknown = set(params) - {"preprocessing", "llm"}
        if unknown:
            raise pb_utils.TritonModelException(f"unknown parameters in config.pbtxt: {sorted(unknown)}")
        steps = {k: params[k] for k in ("preprocessing", "llm") if params.get(k)}
        decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.pipeline = LLMAPIPipeline(name=args["model_name"], decoupled=decoupled, **steps)
        self.control = self.pipeline.attach_lifecycle(args["model_name"], args["model_instance_name"])

    def execute(self, requests):
        for request in requests:
            self.pipeline.submit(request)
        return None

    def finalize(self):
        self.control.close()
        self.pipeline.shutdown()
        gc.collect()  # free response senders while the stub can still take their clean-up
