"""Qwen3 (qwen3, qwen3_moe): `<think>` ... `</think>`. Thinking is on by default; the template opens
the span in the prompt (Qwen3-2507 thinking) or the model writes `<think>` first (older templates);
enable_thinking=false makes the template write an empty, closed span, so the output is all answer."""

from __future__ import annotations

from paddle_llm_engine.reasoning.base import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3's markers; the engine forces "\\n</think>\\n\\n" at a budget (its format after thinking)."""

    name = "qwen3"
