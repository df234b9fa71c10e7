"""Which reasoning parser an engine uses, and per request.

EngineReasoning(setting, model_type, chat_template, tokenizer) resolves the engine's default once at
start (config.pbtxt `reasoning_parser`, EngineConfig.reasoning_parser):
- "auto" (the default): the family of config.json's model_type (qwen3 / qwen3_moe -> qwen3,
  ernie4_5 / ernie4_5_moe -> ernie45, any other -> deepseek_r1) when the chat template mentions a
  thinking marker (`<think>` / `</think>`) and the tokenizer has both markers as single tokens; else
  off. The outcome is logged once.
- "none": off.
- a parser name (PARSERS, or an alias of ALIASES): that family; a tokenizer without its markers is a
  ValueError at start (the operator asked for it).
A request may name another parser (SamplingParams.reasoning_parser, what the OpenAI frontend's
--reasoning-parser asks for): for_request(name) binds it once and caches it; an unknown name, or a
family whose markers the tokenizer lacks, is an InvalidRequestError naming reasoning_parser (INVALID_REASONING).
"""

from __future__ import annotations

import logging
import threading

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError
from paddle_llm_engine.reasoning.base import ReasoningParser, ReasoningUnavailable
from paddle_llm_engine.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from paddle_llm_engine.reasoning.ernie45 import Ernie45ReasoningParser
from paddle_llm_engine.reasoning.qwen3 import Qwen3ReasoningParser

log = logging.getLogger(__name__)

PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser, "ernie45": Ernie45ReasoningParser, "deepseek_r1": DeepSeekR1ReasoningParser,
}
# the names other servers use for the same families (FastDeploy: ernie-x1; SGLang / vLLM spellings)
ALIASES = {"ernie-x1": "ernie45", "ernie_x1": "ernie45", "deepseek-r1": "deepseek_r1"}
FAMILY_OF_MODEL_TYPE = {"qwen3": "qwen3", "qwen3_moe": "qwen3", "ernie4_5": "ernie45", "ernie4_5_moe": "ernie45"}
SETTINGS = ("auto", "none", *PARSERS)


def canonical_name(name: str) -> str:
    """A parser name as PARSERS spells it ("none" and "auto" stay); lower-cased, aliases resolved."""
    n = (name or "").strip().lower()
    return ALIASES.get(n, n)


def auto_family(model_type: str, chat_template: str | None) -> str | None:
    """The family "auto" picks, or None when the template mentions no thinking marker."""
    if not chat_template or ("<think>" not in chat_template and "</think>" not in chat_template):
        return None
    return FAMILY_OF_MODEL_TYPE.get(model_type, "deepseek_r1")


class EngineReasoning:
    """The engine's reasoning setting resolved against its tokenizer (module docstring).

    default: the bound parser requests use unless they name one, or None (off); description: what was
    decided and why, as logged. Thread-safe (for_request runs on callers' threads)."""

    def __init__(self, setting: str, model_type: str, chat_template: str | None, tokenizer):
        self._tokenizer = tokenizer
        self._bound: dict[str, ReasoningParser | None] = {}
        self._lock = threading.Lock()
        name = canonical_name(setting) or "auto"
        if name not in SETTINGS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(SETTINGS)} (or {', '.join(ALIASES)}), "
                             f"got {setting!r}")
        self.default: ReasoningParser | None = None
        if name == "none":
            self.description = "off (reasoning_parser none)"
        elif name == "auto":
            family = auto_family(model_type, chat_template)
            if family is None:
                self.description = (f"off (auto: the chat template of this {model_type or 'model'} "
                                    "mentions no <think> / </think>)")
            else:
                try:
                    self.default = self._bind(family)
                    self.description = f"{family} (auto: model_type {model_type}, the chat template thinks)"
                except ReasoningUnavailable as e:
                    self.description = f"off (auto picked {family}, but {e})"
        else:
            try:
                self.default = self._bind(name)
            except ReasoningUnavailable as e:
                raise ValueError(f"reasoning_parser {name}: {e}") from None
            self.description = f"{name} (reasoning_parser {setting})"
        log.info("reasoning parser: %s", self.description)

    def _bind(self, name: str) -> ReasoningParser:
        with self._lock:
            if name not in self._bound:
                try:
                    self._bound[name] = PARSERS[name].bind(self._tokenizer)
                except ReasoningUnavailable:
                    self._bound[name] = None
                    raise
            p = self._bound[name]
        if p is None:
            raise ReasoningUnavailable(f"the tokenizer has no {PARSERS[name].start_text} / "
                                       f"{PARSERS[name].end_text} tokens")
        return p

    def for_request(self, name: str | None) -> ReasoningParser | None:
        """The parser of a request that names `name` (None: the engine's default; "none": off).
        Raises InvalidRequestError naming reasoning_parser."""
        if name is None:
            return self.default
        n = canonical_name(name)
        if n == "none":
            return None
        if n == "auto":
            return self.default
        if n not in PARSERS:
            raise InvalidRequestError("reasoning_parser", f"unknown parser {name!r} (one of none, auto, "
                                                          f"{', '.join(PARSERS)})", ErrorCode.INVALID_REASONING)
        try:
            return self._bind(n)
        except ReasoningUnavailable as e:
            raise InvalidRequestError("reasoning_parser", f"{n} cannot be used with this model: {e}",
                                      ErrorCode.INVALID_REASONING) from None
