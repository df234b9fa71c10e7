"""The Triton adapter: everything between Triton's Python backend and the engine (paddle_llm_engine).

The model_repository/*/1/model.py files are thin; the work they delegate lives here, in rooms by role:
- llm/: the `llm` model: `LLMInstance` (one engine per instance and everything around it, built and
  closed in order), its two request kinds (vllm_request: a direct vLLM-contract request;
  ensemble_steps: the ensemble's engine requests from the engine channel), the responder thread,
  the delta buffer (when output is worth a response) and TensorRT-LLM `stop` by request id;
- ensemble/: the `ensemble` BLS model: its pipeline (preprocessing -> an llm instance's engine ->
  postprocessing, cancellation, `stop`), its BLS steps and the state of its requests;
- engine_channel/: the transports between our processes: the engine channel the ensemble reaches
  the llm engines by (Unix sockets, not BLS) and its message protocol, which both request rooms
  import (so llm/ and ensemble/ never import each other), the control bus (stop ids, the launcher's
  drain / status) and the abstract socket names they bind;
- lifecycle/: an instance's life apart from its requests: which instance it is, drain, response
  senders still open, the stall watchdog, the supervisor's restart count and failure notice, the
  memory trace, test-only fault injection;
- contracts/: the two client contracts -> SamplingParams (vllm for `llm`, trtllm for `ensemble`),
  the guided-decoding inputs, the max_tokens default and a request's timeout, shared by both rooms;
- metrics/: the llm instance's Prometheus families (names, families, the metrics thread). A room of
  its own, not inside llm/: config_params reads its name sets at load, and nothing else touches
  pb_utils.MetricFamily.

Three modules stay at the root because several rooms (and the model files) share them and none owns
them: config_params.py (config.pbtxt parameters -> EngineConfig and serving options; read by llm/,
the preprocessing model and the launcher's `--set` check), tensors.py (request tensors -> Python
values, errors naming the tensor; every model file and contracts/trtllm) and errors.py (engine error
codes -> Triton error codes; the llm responder and the ensemble pipeline).

The launcher (start, supervise and stop a tritonserver) is a package of its own, paddle_llm_launcher:
no stub imports it, and nothing here imports it. The engine never imports this package. Modules here
import `triton_python_backend_utils` lazily (inside functions), so they import, and their logic is
testable, outside a Triton stub process.
"""
