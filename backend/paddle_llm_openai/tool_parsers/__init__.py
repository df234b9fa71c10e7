"""Tool-call parsers, one per model family (see base.py for the rules they share)."""

from paddle_llm_openai.tool_parsers.base import StreamState, ToolParser
from paddle_llm_openai.tool_parsers.ernie import ErnieToolParser
from paddle_llm_openai.tool_parsers.hermes import HermesToolParser, QwenToolParser
from paddle_llm_openai.tool_parsers.llama3 import Llama3JsonToolParser

__all__ = ["ToolParser", "StreamState", "HermesToolParser", "QwenToolParser", "ErnieToolParser",
           "Llama3JsonToolParser"]
