"""Incremental split of a thinking model's output text into reasoning and content.

ReasoningTextParser is fed the output text delta by delta (any split: a delta may end inside
`</think>` or inside a dropped tag) and returns the reasoning and content parts of each delta; the
parts of every delta joined are exactly the parts of the whole text fed at once, so a stream and a
non-streamed answer agree. Text that may still be the start of a marker is held back until the next
delta (or finish()) decides it.

The rules (one state machine for every family, reasoning/families.py sets the markers):
- thinking=True at the start (the prompt left the model inside its thinking span): everything up to
  the end marker `</think>` is reasoning; an opening `<think>` that the model writes first (after
  nothing but whitespace) is dropped with that whitespace (Qwen3's older templates let the model open
  the span itself). A `<think>` later in the reasoning is reasoning text.
- the end marker is dropped; the content after it starts at its first non-whitespace character
  (the "\\n\\n" a model writes after `</think>` is formatting, not answer).
- thinking=False at the start (the prompt closed the span, e.g. Qwen3 with enable_thinking false):
  everything is content, markers included.
- drop_tags (ERNIE-4.5's `<response>` / `</response>`): removed from the content wherever they occur.
- an output that ends while thinking is all reasoning (truncated thinking), content "".
"""

from __future__ import annotations


def _partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


class ReasoningTextParser:
    """One sequence's split (see the module docstring).

    start / end: the family's marker texts ("<think>", "</think>"); thinking: whether the output starts
    inside the thinking span; drop_tags: content markers to remove. feed(delta) -> (reasoning,
    content), finish() -> (reasoning, content) of the held-back text. `thinking` tells whether the
    end marker has not been seen yet."""

    __slots__ = ("start", "end", "thinking", "drop_tags", "_opener", "_buf", "_lstrip")

    def __init__(self, start: str, end: str, thinking: bool, drop_tags: tuple[str, ...] = ()):
        self.start, self.end = start, end
        self.thinking = thinking
        self.drop_tags = tuple(t for t in drop_tags if t)
        self._opener = thinking  # an opening marker may still come (only whitespace so far)
        self._buf = ""  # held back: a possible marker prefix (thinking) or tag prefix (content)
        self._lstrip = False  # content after an output end marker: its leading whitespace is dropped

    def feed(self, delta: str) -> tuple[str, str]:
        """The reasoning and content parts of `delta` that are certain now (held-back text comes later)."""
        if not delta:
            return "", ""
        s = self._buf + delta
        self._buf = ""
        if not self.thinking:
            return "", self._content(s, final=False)
        if self._opener:
            body = s.lstrip()
            if not body or (len(body) < len(self.start) and self.start.startswith(body)):
                self._buf = s  # whitespace, or a possible opening marker: wait
                return "", ""
            self._opener = False
            if body.startswith(self.start):
                s = body[len(self.start):]
        i = s.find(self.end)
        if i < 0:  # hold back a possible start of the end marker (none without its first character)
            k = _partial_suffix(s, (self.end,)) if self.end[0] in s[1 - len(self.end):] else 0
            self._buf = s[len(s) - k:] if k else ""
            return s[:len(s) - k], ""
        self.thinking = False
        self._lstrip = True
        return s[:i], self._content(s[i + len(self.end):], final=False)

    def finish(self) -> tuple[str, str]:
        """At the end of the output: the held-back text, as what it turned out to be."""
        s, self._buf = self._buf, ""
        if self.thinking:
            self._opener = False
            return s, ""
        return "", self._content(s, final=True)

    def _content(self, s: str, final: bool) -> str:
        if self.drop_tags:
            s = self._buf + s
            self._buf = ""
            for t in self.drop_tags:
                s = s.replace(t, "")
            if not final:
                k = _partial_suffix(s, self.drop_tags)
                if k:
                    s, self._buf = s[:len(s) - k], s[len(s) - k:]
        if self._lstrip and s:
            s = s.lstrip()
            if s:
                self._lstrip = False
        return s


def split_text(text: str, start: str, end: str, thinking: bool, drop_tags: tuple[str, ...] = ()) -> tuple[str, str]:
    """(reasoning, content) of a whole output: ReasoningTextParser fed `text` at once."""
    p = ReasoningTextParser(start, end, thinking, drop_tags)
    r1, c1 = p.feed(text)
    r2, c2 = p.finish()
    return r1 + r2, c1 + c2
