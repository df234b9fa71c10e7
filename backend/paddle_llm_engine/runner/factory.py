"""Pick the runner class for a resolved device string ("cpu" or "gcu:<id>")."""

from __future__ import annotations


def create_runner(engine_config, model_config, device: str):
    if engine_config.tensor_parallel_size > 1:  # N worker processes, this process only samples
        from paddle_llm_engine.tp.runner import TPModelRunner

        return TPModelRunner(engine_config, model_config, device)
    if device.startswith("gcu"):
        from paddle_llm_engine.runner.gcu_runner import GCUModelRunner

        return GCUModelRunner(engine_config, model_config, device)
    from paddle_llm_engine.runner.cpu_runner import CPUModelRunner

    return CPUModelRunner(engine_config, model_config, device)
