"""The Triton adapter: everything between Triton's Python backend and the engine (paddle_llm_engine).

The model_repository/*/1/model.py files are thin; the work they delegate lives here:
- contracts/: the two client contracts -> SamplingParams (vllm.py for `llm`, trtllm.py for `ensemble`)
- tensors.py: request tensors -> Python values, errors naming the tensor
- config_params.py, instances.py: config.pbtxt parameters -> EngineConfig, instance -> device
- responder.py: the thread that turns engine outputs into Triton responses (and sees cancellation)
- metrics.py: the thread that makes every pb_utils.MetricFamily call
- stop_requests.py: TensorRT-LLM `stop` by request id, across instances over control_bus.py (datagrams
  between our processes: stop ids, the launcher's drain / status); drain.py: refuse new requests,
  let the rest finish; health.py: the stall watchdog; restarts.py: the supervisor's restart count
- ensemble_pipeline.py: the `ensemble` BLS model (preprocessing -> an llm instance's engine ->
  postprocessing), the state of its requests in ensemble_requests.py
- engine_channel/: how the ensemble reaches the llm instances' engines (Unix sockets, not BLS);
  ensemble_protocol.py: the messages on it; ensemble_steps.py: the llm side that serves them
- delta_buffer.py: when a sequence's output is worth a response (both response paths)
- errors.py: engine error codes -> Triton error codes
- fault_injection.py: test-only engine failure
- launcher/: start, watch and stop a tritonserver with this repository (tests, benchmarks, make serve)

The engine never imports this package. Modules here import `triton_python_backend_utils` lazily
(inside functions), so they import, and their logic is testable, outside a Triton stub process.
"""
