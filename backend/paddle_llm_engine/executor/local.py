"""LocalExecutor: one Worker in the engine's own process (tensor_parallel_size 1)."""

from __future__ import annotations

import numpy as np

from paddle_llm_engine.config import EngineConfig, ModelConfig
from paddle_llm_engine.platforms import Device
from paddle_llm_engine.step import Step
from paddle_llm_engine.worker import Worker


class LocalExecutor:
    """The executor interface (executor/__init__.py) over one in-process Worker, started in its
    explicit steps: build, size the KV cache, allocate it. Raises as Worker."""

    def __init__(self, engine_config: EngineConfig, model_config: ModelConfig, device: Device):
        self.device = device
        self.worker = Worker(engine_config, model_config, device)
        self.num_kv_blocks = self.worker.determine_num_kv_blocks()
        self.worker.initialize_cache(self.num_kv_blocks)
        self.plan = self.worker.plan

    def execute(self, step: Step) -> np.ndarray:
        """The sampled rows' logits of `step`, [step.num_sampled, vocab] fp32."""
        return self.worker.execute(step)

    def dead_worker(self) -> str | None:
        """Always None: the worker is this process."""
        return None

    def close(self) -> None:
        """Nothing to release: the worker lives and dies with this process."""
