"""TensorRT-LLM's current Triton model, the Python "llmapi" model (`tensorrt_llm`): its inputs and
outputs on the same engine as `llm` and `ensemble` (contract.py: the mapping; pipeline.py: the
requests, built on the ensemble's pipeline: preprocessing -> the engine channel -> the client)."""
