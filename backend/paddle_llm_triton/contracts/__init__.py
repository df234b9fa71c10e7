"""The two client contracts the Triton models accept, one module each, mapped to SamplingParams:

- vllm.py: Triton's vLLM backend (model `llm`): the `sampling_parameters` JSON object.
- trtllm.py: Triton's TensorRT-LLM ensemble (model `ensemble`): one input tensor per parameter;
  trtllm_lora.py: its per-request LoRA tensors (lora_weights / lora_config) <-> PEFT folders.
- guided.py: the guided-decoding inputs of both, -> GuideSpec; values.py: JSON value conversion.
- defaults.py: the serving default of max_tokens; timeout.py: a request's Triton timeout (both
  contracts honour it) -> the engine's per-request deadline.
"""
