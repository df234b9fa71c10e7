"""Model `ensemble`: the TensorRT-LLM ensemble contract as a decoupled Python (BLS) model that calls
preprocessing -> llm -> postprocessing itself, so that a client's cancellation (which Triton 2.51
does not pass into the steps of a real ensemble) stops the engine's work. The pipeline, the
cancellation watcher and the `stop` signal live in paddle_llm_triton/ensemble/pipeline.py.
execute() hands each request to the pipeline and returns at once."""

import gc
import json

import triton_python_backend_utils as pb_utils

from paddle_llm_triton.ensemble.pipeline import EnsemblePipeline


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise pb_utils.TritonModelException("model `ensemble` must use the decoupled transaction policy")
        params = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
        steps = {k: params[k] for k in ("preprocessing", "llm", "postprocessing") if params.get(k)}
        unknown = set(params) - {"preprocessing", "llm", "postprocessing", "coalesce_stream_responses"}
        if unknown:
            raise pb_utils.TritonModelException(f"unknown parameters in config.pbtxt: {sorted(unknown)}")
        coalesce = params.get("coalesce_stream_responses", "").strip().lower() or "true"
        if coalesce not in ("true", "false"):
            raise pb_utils.TritonModelException(
                f"config.pbtxt parameter coalesce_stream_responses must be true or false, got {coalesce!r}")
        # a stream that fell behind: the frames that arrived meanwhile in one response
        self.pipeline = EnsemblePipeline(name=args["model_name"], coalesce=coalesce == "true", **steps)
        # the launcher's drain: refuse new requests, let those in flight finish (their engine
        # requests are ended by the llm instances' own drain at the deadline)
        self.control = self.pipeline.attach_lifecycle(args["model_name"], args["model_instance_name"])

    def execute(self, requests):
        for request in requests:
            self.pipeline.submit(request)
        return None

    def finalize(self):
        self.control.close()
        self.pipeline.shutdown()
        # Any cycle still holding a response sender is freed now, while the stub can take its
        # clean-up; at the stub's exit that clean-up would reach for a stub already destroyed.
        gc.collect()
