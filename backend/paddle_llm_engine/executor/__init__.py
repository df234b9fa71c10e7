"""Executors: what the engine talks to for its model steps. An executor owns the engine's
Worker(s) and offers one interface:

    num_kv_blocks: int            KV blocks per device (the scheduler's block pool)
    plan: PlatformPlan            what the worker(s) run (dtype, KV-cache dtype, kernels, quantization)
    device: Device                the (first) device
    execute(step) -> np.ndarray   the sampled rows' logits, [step.num_sampled, vocab] fp32
    close()                       release processes (idempotent)
    dead_worker() -> str | None   which worker process has exited by itself (None: all alive, or none)

- LocalExecutor (local.py): one Worker in this process.
- TPExecutor (tensor_parallel.py): tensor_parallel_size worker processes (tp_worker.py), one per
  device, each a Worker on its shard of the model, fed over sockets (channel.py) with the logits
  assembled in shared memory; processes.py starts, watches and stops them. With
  EngineConfig.tp_hosts some ranks run on other hosts, started there by the operator, and join over
  token-authenticated TCP (remote.py), sending their logits columns with each answer.
"""

from __future__ import annotations

from paddle_llm_engine.config import EngineConfig, ModelConfig
from paddle_llm_engine.executor.local import LocalExecutor
from paddle_llm_engine.executor.tensor_parallel import TPExecutor, WorkerFailure
from paddle_llm_engine.platforms import Device


def create_executor(engine_config: EngineConfig, model_config: ModelConfig, device: Device):
    """The executor for the engine's settings: TPExecutor when tensor_parallel_size > 1, else
    LocalExecutor. Raises as their constructors."""
    if engine_config.tensor_parallel_size > 1:
        return TPExecutor(engine_config, model_config, device)
    return LocalExecutor(engine_config, model_config, device)


__all__ = ["LocalExecutor", "TPExecutor", "WorkerFailure", "create_executor"]
