"""Hermes / Qwen format: each call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Qwen2 / Qwen2.5 / Qwen3 (and their MoE models) are trained on it and their chat templates describe it
to the model when `tools` are passed; ChatML models without tool support in their template (the
default SmolLM2 model) get the same description from chat_template.ChatRenderer."""

from __future__ import annotations

from paddle_llm_openai.tool_parsers.base import ToolParser


class HermesToolParser(ToolParser):
    """`<tool_call>` JSON blocks (NousResearch Hermes' format, ChatML models)."""

    name = "hermes"


class QwenToolParser(HermesToolParser):
    """Qwen2 / Qwen2.5 / Qwen3 and their MoE models: the Hermes format."""

    name = "qwen"
