"""Llama 3.1+ JSON format: the whole answer is one or more JSON objects
`{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`, several joined by `;`), as the
Llama 3.1 / 3.2 chat templates ask for when `tools` are passed. An answer that does not start with
`{` or `<|python_tag|>` (after whitespace) is plain content."""

from __future__ import annotations

import re

from paddle_llm_openai.tool_parsers.base import JsonScanner, StreamState, ToolParser

PYTHON_TAG = "<|python_tag|>"
_SEP = re.compile(r"[\s;]*")


class Llama3JsonToolParser(ToolParser):
    """Llama 3 JSON calls (`parameters` or `arguments` accepted; `parameters` written)."""

    name = "llama3_json"
    start_tag = ""
    end_tag = ""
    args_key = "parameters"

    def stream(self) -> "Llama3Stream":
        return Llama3Stream(self)

    def call_text(self, name: str, arguments) -> str:
        return super().call_text(name, arguments).strip()

    def grammar_prefix(self, name: str) -> str:
        return super().grammar_prefix(name).lstrip()

    def grammar_suffix(self) -> str:
        return "}"


class Llama3Stream(StreamState):
    """Calls are bare JSON objects: one starts at a `{` (first thing in the answer, or after the
    previous call and `;` / whitespace) and ends where that object closes."""

    def __init__(self, parser: ToolParser):
        super().__init__(parser)
        self.plain = False  # decided: the answer is content

    def _find_start(self, final: bool) -> tuple[int, int | None]:
        text, i = self.text, self.i
        if self.plain:
            return len(text), None
        p = _SEP.match(text, i).end() if self.n_calls else i + len(text[i:]) - len(text[i:].lstrip())
        rest = text[p:]
        if self.n_calls == 0 and rest.startswith(PYTHON_TAG):
            q = p + len(PYTHON_TAG)
            q += len(text[q:]) - len(text[q:].lstrip())
            if q < len(text) and text[q] == "{":
                return i, q
            if q < len(text) or final:
                self.plain = True
                return len(text), None
            return i, None
        if rest.startswith("{"):
            return i, p
        if not rest or (self.n_calls == 0 and PYTHON_TAG.startswith(rest) and not final):
            return (len(text) if final else i), None
        self.plain = True
        return len(text), None

    def _find_end(self, final: bool) -> tuple[int, int | None]:
        scan = self.cur.get("end_scan")
        if scan is None:
            scan = self.cur["end_scan"] = JsonScanner(self.body)
        k = scan.advance(self.text, len(self.text))
        if k is not None:
            return k, k
        return len(self.text), None
