"""Model definitions (Paddle, fp32) and the registry that maps HF `model_type` to a class."""

from paddle_llm_engine.models.registry import build_model

__all__ = ["build_model"]
