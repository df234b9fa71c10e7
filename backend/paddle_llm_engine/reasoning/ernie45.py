"""ERNIE-4.5 thinking (ernie4_5, ernie4_5_moe; ERNIE-4.5-21B-A3B-Thinking, FastDeploy's `ernie-x1`):
the output starts inside the thinking span, `</think>` ends it, and the answer may be wrapped in
`<response>` ... `</response>`, markers that are not content (dropped). Its template has no switch
to turn thinking off."""

from __future__ import annotations

from paddle_llm_engine.reasoning.base import ReasoningParser


class Ernie45ReasoningParser(ReasoningParser):
    """ERNIE-4.5 thinking's markers; "\\n</think>\\n\\n" forced at a budget; <response> tags dropped."""

    name = "ernie45"
    drop_tags = ("<response>", "</response>")
