"""ERNIE 4.5 format: calls as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks
(ERNIE-4.5-21B-A3B-Thinking's chat template and FastDeploy's `ernie-x1` parser); the answer text may
be wrapped in `<response>` ... `</response>`, markers that are not content and are removed here. The
thinking (`<think>` ... `</think>`) never reaches this parser when `llm` splits it off
(docs/features/reasoning.md); with --reasoning-parser none it stays in content."""

from __future__ import annotations

from paddle_llm_openai.tool_parsers.base import ToolParser


class ErnieToolParser(ToolParser):
    """ERNIE 4.5 (dense and MoE): `<tool_call>` JSON blocks, `<response>` markers dropped."""

    name = "ernie"
    content_drop_tags = ("<response>", "</response>")
