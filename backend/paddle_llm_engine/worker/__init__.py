"""One device's share of an engine: the Worker (worker.py: platform plan, kernels, model, KV cache,
one Step in, logits out) and the packing of a Step into the model's inputs (inputs.py).

Nothing here imports the executors, the tensor-parallel package, the sampler or a Sequence: an
executor gives a tensor-parallel rank its shard's model through Worker(make_model=...)."""

from paddle_llm_engine.worker.worker import Worker

__all__ = ["Worker"]
