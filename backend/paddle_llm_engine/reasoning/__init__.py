"""Reasoning (thinking) models: which parser a model gets, the text split of its output into
reasoning and answer, and the per-sequence thinking state the engine enforces budgets with.

- registry.py: EngineReasoning (the engine's setting: auto / none / a family; per-request names).
- base.py: ReasoningParser (a family bound to a tokenizer) and ThinkingState (per sequence).
- qwen3.py, ernie45.py, deepseek_r1.py: one family each.
- text_parser.py: ReasoningTextParser, the incremental text split (exact under any delta split).
"""

from paddle_llm_engine.reasoning.base import ReasoningParser, ReasoningUnavailable, ThinkingState
from paddle_llm_engine.reasoning.registry import ALIASES, PARSERS, EngineReasoning, auto_family, canonical_name
from paddle_llm_engine.reasoning.text_parser import ReasoningTextParser, split_text

__all__ = ["ALIASES", "PARSERS", "EngineReasoning", "ReasoningParser", "ReasoningTextParser", "ReasoningUnavailable",
           "ThinkingState", "auto_family", "canonical_name", "split_text"]
