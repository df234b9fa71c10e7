"""DeepSeek-R1 style (DeepSeek-R1 and its distills on Qwen2 / Llama, QwQ): `<think>` ... `</think>`;
the template opens the span in the prompt (`<｜Assistant｜><think>\\n`), or the model writes `<think>`
first; the text before `</think>` is reasoning either way."""

from __future__ import annotations

from paddle_llm_engine.reasoning.base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1's markers; "\\n</think>\\n\\n" forced at a budget."""

    name = "deepseek_r1"
