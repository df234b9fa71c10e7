"""The reference split of a reasoning model's text into (reasoning, content), written independently
of the engine's parser: regular expressions over the whole text, with the rules of
backend/paddle_llm_engine/reasoning/text_parser.py's docstring. Used by tests/unit/test_reasoning_parsers.py,
tests/unit/test_reasoning_engine.py and tests/openai/test_reasoning_openai.py."""

from __future__ import annotations

import re


def reference_split(text: str, thinking: bool, drop_tags=()) -> tuple[str, str]:
    """(reasoning, content) by the documented rules, with regular expressions over the whole text."""
    if not thinking:
        content = text
    else:
        m = re.match(r"\s*<think>", text)
        body = text[m.end():] if m else text
        if "</think>" not in body:
            return body, ""
        reasoning, content = body.split("</think>", 1)
        for t in drop_tags:
            content = content.replace(t, "")
        return reasoning, content.lstrip()
    for t in drop_tags:
        content = content.replace(t, "")
    return "", content
