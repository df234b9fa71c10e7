"""CPU runner: Paddle's CPU kernels (fp32 only), thread count set explicitly.

Paddle sets OMP_NUM_THREADS=1 on import when unset, so the thread count is applied here.
"""

from __future__ import annotations

import os

import paddle

from paddle_llm_engine.platforms import host_available_memory
from paddle_llm_engine.runner.base import ModelRunnerBase


class CPUModelRunner(ModelRunnerBase):
    def setup_device(self) -> None:
        paddle.set_device("cpu")
        n = self.config.num_threads or os.cpu_count() or 1
        paddle.base.core.set_num_threads(n)
        self.num_threads = n

    def configure_kernels(self) -> None:
        """The C++ CPU kernels use as many threads as Paddle's kernels (num_threads)."""
        if self.plan.cpu_isa is not None:
            from paddle_llm_ops import cpu_kernels

            cpu_kernels.set_num_threads(self.num_threads)

    def available_memory_bytes(self) -> int | None:
        """The host's MemAvailable (the weights are already loaded when this is asked)."""
        return host_available_memory()
