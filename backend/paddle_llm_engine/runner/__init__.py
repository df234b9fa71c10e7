"""Model runners: one base that builds step inputs and samples, one subclass per device."""

from paddle_llm_engine.runner.base import ModelRunnerBase, StepResult
from paddle_llm_engine.runner.factory import create_runner

__all__ = ["ModelRunnerBase", "StepResult", "create_runner"]
