"""A thinking family's markers bound to one tokenizer (ReasoningParser), and the per-sequence state
the engine keeps while a sequence thinks (ThinkingState).

A family (qwen3.py, ernie45.py, deepseek_r1.py) names its markers (`<think>`, `</think>`), the token
sequence the engine forces to end the thinking at a budget (`"\\n</think>\\n\\n"`) and the content
markers to drop. Binding it to a tokenizer (ReasoningParser.bind) resolves them to token ids; a
tokenizer without both markers as single tokens cannot think in that family (ReasoningUnavailable).

Where a sequence starts: inside the thinking span unless the prompt's last marker is an end marker
followed by nothing but whitespace (a template that closed the span, as Qwen3's enable_thinking=false
writes `<think>\\n\\n</think>\\n\\n`). So a prompt ending in `<think>\\n` (Qwen3-2507 thinking, DeepSeek-R1,
ERNIE-4.5 thinking templates), or with no marker after the last turn (the model opens `<think>`
itself), starts thinking; an end marker of an earlier turn followed by more turns does not count.
"""

from __future__ import annotations

from typing import ClassVar

from paddle_llm_engine.reasoning.text_parser import ReasoningTextParser

_WHITESPACE_TAIL = 8  # tokens after a prompt's last end marker that may still be only whitespace


class ReasoningUnavailable(ValueError):
    """The tokenizer lacks a family's markers as single tokens: that family cannot be used."""


class ReasoningParser:
    """One family bound to one tokenizer. Subclasses set the class attributes:

    name: the parser's name (config.pbtxt reasoning_parser, OpenAI --reasoning-parser);
    start_text / end_text: the markers of the thinking span;
    end_sequence_text: what the engine forces when a budget runs out (tokenized with the model's
        tokenizer; must hold the end marker once);
    drop_tags: content markers removed from the answer (ERNIE-4.5's <response>).

    Bound attributes: start_id / end_id (int token ids), end_sequence (tuple of int ids),
    special_marker_ids (the marker ids the tokenizer calls special, so that skip_special_tokens would
    hide them; the detokenizer keeps them for reasoning sequences so the text split can see them) and
    hidden_ids (every id skip_special_tokens drops, given only when some marker is special)."""

    name: ClassVar[str] = ""
    start_text: ClassVar[str] = "<think>"
    end_text: ClassVar[str] = "</think>"
    end_sequence_text: ClassVar[str] = "\n</think>\n\n"
    drop_tags: ClassVar[tuple[str, ...]] = ()

    def __init__(self, start_id: int, end_id: int, end_sequence: tuple[int, ...],
                 special_marker_ids: frozenset[int] = frozenset(), decode=None,
                 hidden_ids: frozenset[int] = frozenset()):
        self.start_id = int(start_id)
        self.end_id = int(end_id)
        self.end_sequence = tuple(int(t) for t in end_sequence)
        self.special_marker_ids = frozenset(special_marker_ids)
        self.hidden_ids = frozenset(hidden_ids)
        self._decode = decode  # ids -> text (whitespace check of a prompt's tail)

    @classmethod
    def bind(cls, tokenizer) -> "ReasoningParser":
        """This family on `tokenizer` (a HF-style tokenizer: get_vocab, encode, decode). Raises
        ReasoningUnavailable naming the marker that is not a single token."""
        vocab = tokenizer.get_vocab()
        ids = []
        for text in (cls.start_text, cls.end_text):
            tid = vocab.get(text)
            if tid is None:
                raise ReasoningUnavailable(f"the tokenizer has no {text} token")
            ids.append(int(tid))
        seq = [int(t) for t in tokenizer.encode(cls.end_sequence_text, add_special_tokens=False)]
        if seq.count(ids[1]) != 1:  # the tokenizer splits the marker: force the marker alone
            seq = [ids[1]]
        special = _special_ids(tokenizer)
        marked = frozenset(i for i in ids if i in special)
        return cls(ids[0], ids[1], tuple(seq), marked, decode=lambda t: tokenizer.decode(t, skip_special_tokens=False),
                   hidden_ids=special if marked else frozenset())

    def thinks_at_start(self, prompt_ids) -> bool:
        """Whether the output starts inside the thinking span (module docstring). prompt_ids: the
        prompt's token ids as the engine runs it. Cost: one reverse scan of the prompt."""
        for i in range(len(prompt_ids) - 1, -1, -1):
            t = prompt_ids[i]
            if t == self.start_id:
                return True
            if t == self.end_id:
                tail = list(prompt_ids[i + 1:])
                if len(tail) > _WHITESPACE_TAIL:  # more turns follow that end marker
                    return True
                return bool(tail) and self._decode is not None and self._decode(tail).strip() != ""
        return True

    def text_parser(self, thinking: bool) -> ReasoningTextParser:
        """A fresh incremental text split for one sequence that starts thinking or not."""
        return ReasoningTextParser(self.start_text, self.end_text, thinking, self.drop_tags)

    def new_state(self, thinking: bool, budget: int | None) -> "ThinkingState":
        """A sequence's token-level state (budget: reasoning_max_tokens, or None)."""
        return ThinkingState(self.end_id, self.end_sequence, thinking, budget)


def _special_ids(tokenizer) -> frozenset[int]:
    """Ids the tokenizer drops with skip_special_tokens: its special tokens and the added tokens
    flagged special."""
    ids = set(int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ())
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return frozenset(ids)


class ThinkingState:
    """One sequence's thinking, token by token (engine thread only).

    thinking: the sequence is inside its thinking span (no end marker yet). num_thinking: tokens the
    model chose while thinking (what the budget counts); num_reasoning: output tokens up to and
    including the end marker (usage's reasoning_tokens: chosen and forced). When num_thinking reaches
    the budget, forced_token() returns the end sequence one token per step and the sampler emits it
    instead of drawing; `active` (thinking, or the end sequence not fully emitted) is when guided
    decoding waits and the tokens are not fed to the guide."""

    __slots__ = ("end_id", "end_sequence", "budget", "thinking", "num_thinking", "num_reasoning", "_forced")

    def __init__(self, end_id: int, end_sequence: tuple[int, ...], thinking: bool, budget: int | None):
        self.end_id = end_id
        self.end_sequence = end_sequence
        self.budget = budget
        self.thinking = thinking
        self.num_thinking = 0
        self.num_reasoning = 0
        self._forced: list[int] = []

    @property
    def active(self) -> bool:
        return self.thinking or bool(self._forced)

    def forced_token(self) -> int | None:
        """The token the sampler must emit now, or None to draw as usual."""
        if self._forced:
            return self._forced[0]
        if self.thinking and self.budget is not None and self.num_thinking >= self.budget:
            self._forced = list(self.end_sequence)
            return self._forced[0]
        return None

    def observe(self, token: int) -> None:
        """The token the sequence just appended (chosen or forced)."""
        if self._forced and token == self._forced[0]:
            self._forced.pop(0)
        elif self.thinking:
            self.num_thinking += 1
        if self.thinking:
            self.num_reasoning += 1
            if token == self.end_id:
                self.thinking = False
