"""Pick the runner class for a resolved device string ("cpu" or "gcu:<id>")."""

from __future__ import annotations


def create_runner(engine_config, model_config, device: str):
    if device.startswith("gcu"):
        from paddle_llm_engine.runner.gcu_runner import GCUModelRunner

        return GCUModelRunner(engine_config, model_config, device)
    from paddle_llm_engine.runner.cpu_runner import CPUModelRunner

    return CPUModelRunner(engine_config, model_config, device)
