"""PaddlePaddle LLM engine for Triton: a scheduler over a paged KV cache, executors over per-device workers.

Importing this package sets MKL_DEBUG_CPU_TYPE=5 unless already set, before Paddle loads: the MKL
bundled with Paddle otherwise takes a slow generic path on AMD CPUs (about 2x on batched GEMM).
"""

import os

os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")

from paddle_llm_engine.config import EngineConfig, ModelConfig  # noqa: E402
from paddle_llm_engine.engine import LLMEngine  # noqa: E402
from paddle_llm_engine.engine_loop import EngineLoop  # noqa: E402
from paddle_llm_engine.errors import EngineBusyError, EngineDeadError, ErrorCode, InvalidRequestError  # noqa: E402
from paddle_llm_engine.llm import LLM  # noqa: E402
from paddle_llm_engine.outputs import RequestOutput  # noqa: E402
from paddle_llm_engine.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "EngineBusyError", "EngineConfig", "EngineDeadError", "EngineLoop", "ErrorCode", "InvalidRequestError",
           "LLMEngine", "ModelConfig", "RequestOutput", "SamplingParams"]
