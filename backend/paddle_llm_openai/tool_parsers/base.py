"""Tool-call parsing shared by every model family: the model's output text -> OpenAI `tool_calls`.

A model writes a tool call as text in its own format (Qwen / Hermes: `<tool_call>{json}</tool_call>`;
Llama 3: a bare JSON object). A `ToolParser` knows one format:

- `parse(text) -> (content, tool_calls)`: the whole output at once. content is the text that is not
  a call (None when there is none); tool_calls are OpenAI objects
  `{"id": "call_<hex>", "type": "function", "function": {"name", "arguments": JSON text}}`.
- `stream() -> StreamState`: `feed(delta_text) -> [delta dicts]`, then `finish() -> [delta dicts]`,
  the OpenAI chat-completion stream deltas (`{"content": ...}` or `{"tool_calls": [{"index", "id",
  "type", "function": {"name", "arguments": ""}}]}` first, then `{"tool_calls": [{"index",
  "function": {"arguments": piece}}]}`). Text is held back only while it may still be the start of
  a tag, a call's name, or trailing whitespace, so a tag or a JSON string cut across deltas parses.
  `parse` is the same state machine fed the whole text, so the streamed pieces joined are always
  exactly what `parse` returns.

Rules (both ways):
- content: the text before the first call, without its trailing whitespace, None when empty; text
  outside calls after the first one counts too when it is not whitespace. Without any call the
  content is the text unchanged.
- a call whose JSON starts `{"name": "<name>", "arguments": ` (or `"parameters"`) streams as it is
  generated: the name delta as soon as the name string is complete, then the raw text of the
  arguments value (an object or array, scanned with string / escape awareness to find its end).
  arguments is that raw text, so it is valid JSON whenever the call was complete.
- any other key order is parsed when the call's text is complete (the arguments re-serialized);
  arguments given as a JSON string are taken as the string's value.
- a call that is not valid JSON (or has no string "name") is left in content as the text it was;
  one cut off by the end of the output (finish_reason "length") keeps what was streamed.
"""

from __future__ import annotations

import json
import re
import uuid

ARG_KEYS = ("arguments", "parameters")
_NAME_PREFIX = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS_PREFIX = re.compile(r'\s*,\s*"(arguments|parameters)"\s*:\s*')


def new_call_id() -> str:
    """An OpenAI-style tool-call id: "call_" + 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


class JsonScanner:
    """Finds where the JSON object / array opening at s[start] (`{` or `[`) ends, incrementally:
    advance(s, upto) scans only what it has not seen, so a value that grows delta by delta costs
    O(its length) in all. Brackets inside strings (with escapes) do not count."""

    def __init__(self, start: int):
        self.pos = start
        self.depth = 0
        self.in_str = self.esc = False
        self.end: int | None = None

    def advance(self, s: str, upto: int) -> int | None:
        """Scan s[pos:upto]; the index just past the value once it closed, else None."""
        if self.end is not None:
            return self.end
        depth, in_str, esc = self.depth, self.in_str, self.esc
        for k in range(self.pos, upto):
            c = s[k]
            if in_str:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self.end = k + 1
                    return self.end
        self.pos, self.depth, self.in_str, self.esc = max(self.pos, upto), depth, in_str, esc
        return None


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `text` ends with (0 if none)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def call_from_json(obj) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a parsed call object, or None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = next((obj[k] for k in ARG_KEYS if k in obj), {})
    if isinstance(args, str):
        return obj["name"], args
    return obj["name"], json.dumps(args, ensure_ascii=False)


class ToolParser:
    """One model family's tool-call format (see the module docstring). Subclasses set the class
    attributes and, for a format without tags, override the block hooks."""

    name = "base"
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"
    args_key = "arguments"        # the key the format's prompt and grammar use
    content_drop_tags: tuple[str, ...] = ()  # markers removed from content (e.g. ERNIE's <response>)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls) of a whole output; see the module docstring."""
        st = self.stream()
        deltas = st.feed(text) + st.finish()
        content = "".join(d["content"] for d in deltas if "content" in d)
        calls: list[dict] = []
        for d in deltas:
            for tc in d.get("tool_calls", ()):
                if tc["index"] == len(calls):
                    calls.append({"id": tc["id"], "type": "function",
                                  "function": {"name": tc["function"]["name"], "arguments": ""}})
                calls[tc["index"]]["function"]["arguments"] += tc["function"].get("arguments", "")
        return content or None, calls

    def stream(self) -> "StreamState":
        """A new streaming state for one output."""
        return StreamState(self)

    def call_text(self, name: str, arguments) -> str:
        """How this format writes one call (for assistant history when the template cannot)."""
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return f'{self.start_tag}\n{{"name": {json.dumps(name)}, "{self.args_key}": {args}}}\n{self.end_tag}'

    def grammar_prefix(self, name: str) -> str:
        """The fixed text of a forced call up to its arguments value."""
        return f'{self.start_tag}\n{{"name": {json.dumps(name)}, "{self.args_key}": '

    def grammar_suffix(self) -> str:
        """The fixed text of a forced call after its arguments value."""
        return "}\n" + self.end_tag

class StreamState:
    """One streamed output through a ToolParser: feed(delta) / finish() -> OpenAI delta dicts."""

    def __init__(self, parser: ToolParser):
        self.p = parser
        self.text = ""
        self.i = 0                # text[:i] is consumed (outside calls)
        self.body: int | None = None  # start of the open call's body, None outside a call
        self.pending = ""         # content held back (trailing whitespace / partial marker)
        self.n_calls = 0          # calls started (the next call's index)
        self.after_call = False   # drop whitespace that follows a call
        self.cur: dict | None = None  # the open call: named, index, sent (argument chars), a0 / scan
        self.end_from = 0         # where the search for the open call's end tag resumes
        self.done = False

    def feed(self, delta_text: str) -> list[dict]:
        if self.done:
            raise RuntimeError("feed() after finish()")
        self.text += delta_text
        return self._advance(final=False)

    def finish(self) -> list[dict]:
        if self.done:
            return []
        out = self._advance(final=True)
        self.done = True
        return out

    # block hooks: where a call's text starts and ends (a format without tags overrides them)
    def _find_start(self, final: bool) -> tuple[int, int | None]:
        """Scan for the next call from text[i:]: (end of the content before it, start of the call's
        body) or, when none starts yet, (end of the content that is safe to emit, None)."""
        tag, text = self.p.start_tag, self.text
        j = text.find(tag, self.i)
        if j >= 0:
            return j, j + len(tag)
        return (len(text) if final else len(text) - partial_suffix(text[self.i:], tag)), None

    def _find_end(self, final: bool) -> tuple[int, int | None]:
        """The open call (body from self.body): (end of its body, index after the call) or, when
        it is not closed yet, (end of the body safe to read, None)."""
        tag, text = self.p.end_tag, self.text
        k = text.find(tag, max(self.body, self.end_from))
        if k >= 0:
            return k, k + len(tag)
        self.end_from = max(self.body, len(text) - len(tag) + 1)
        return (len(text) if final else len(text) - partial_suffix(text[self.body:], tag)), None

    # --- internals ---
    def _advance(self, final: bool) -> list[dict]:
        out: list[dict] = []
        while True:
            if self.body is None:
                end, body = self._find_start(final)
                self._content(self.text[self.i:end], out)
                self.i = end
                if body is None:
                    if final:
                        self._flush_content(out)
                    return out
                self.pending = ""  # whitespace / partial markers before a call are not content
                self.body, self.end_from = body, body
                self.cur = {"named": False, "sent": 0, "index": None, "a0": None, "scan": None}
            end, after = self._find_end(final)
            body_text = self.text[self.body:end]
            if after is None and not final:
                self._progress(body_text, out)
                return out
            was_call = self._close(body_text, self.text[self.i:after if after is not None else len(self.text)], out)
            self.i = after if after is not None else len(self.text)
            self.body = self.cur = None
            self.after_call = was_call
            if after is None:
                return out

    def _content(self, s: str, out: list[dict]) -> None:
        if self.after_call and not self.pending:
            s = s.lstrip()
        if not s:
            return
        self.after_call = False
        buf = self.pending + s
        for tag in self.p.content_drop_tags:
            buf = buf.replace(tag, "")
        hold = max([partial_suffix(buf, t) for t in self.p.content_drop_tags] + [0])
        safe = buf[:len(buf) - hold]
        emit = safe.rstrip()
        self.pending = buf[len(emit):]
        if emit:
            out.append({"content": emit})

    def _flush_content(self, out: list[dict]) -> None:
        if self.pending and self.n_calls == 0:
            out.append({"content": self.pending})
        elif self.pending.strip():
            out.append({"content": self.pending.rstrip()})
        self.pending = ""

    def _start_call(self, name: str, out: list[dict]) -> None:
        self.cur["named"] = True
        self.cur["index"] = self.n_calls
        self.n_calls += 1
        out.append({"tool_calls": [{"index": self.cur["index"], "id": new_call_id(), "type": "function",
                                    "function": {"name": name, "arguments": ""}}]})

    def _args(self, piece: str, out: list[dict]) -> None:
        if piece:
            self.cur["sent"] += len(piece)
            out.append({"tool_calls": [{"index": self.cur["index"], "function": {"arguments": piece}}]})

    def _fast(self, body: str):
        """(name, start of the arguments value or None) when the body opens name-first, else None;
        the start only once it is known to be an object or array (streamable)."""
        m = _NAME_PREFIX.match(body)
        if not m:
            return None
        try:
            name = json.loads('"' + m.group(1) + '"')
        except json.JSONDecodeError:
            return None
        a = _ARGS_PREFIX.match(body, m.end())
        if not a or a.end() >= len(body) or body[a.end()] not in "{[":
            return name, None
        return name, a.end()

    def _progress(self, body: str, out: list[dict]) -> None:
        """Send what is new in the open call: its name once complete, then argument text."""
        cur = self.cur
        if cur["a0"] is None:
            f = self._fast(body)
            if f is None:
                return
            if not cur["named"]:
                self._start_call(f[0], out)
            if f[1] is None:
                return
            cur["a0"], cur["scan"] = f[1], JsonScanner(f[1])
        a1 = cur["scan"].advance(body, len(body))
        self._args(body[cur["a0"] + cur["sent"]:a1 if a1 is not None else len(body)], out)

    def _close(self, body: str, raw: str, out: list[dict]) -> bool:
        """The call's text is complete (closed, or the output ended): send what is left of it.
        Returns False when it was not a call (its text went to content)."""
        if self.cur["named"] or self._fast(body) is not None:
            self._progress(body, out)
            if self.cur["sent"] == 0:  # name-first but the arguments came later or not at all
                call = self._load(body)
                self._args(call[1] if call else "{}", out)
            return True
        call = self._load(body)
        if call is None:  # not a call: the text stays content
            self.after_call = False
            self._content(raw, out)
            return False
        self._start_call(call[0], out)
        self._args(call[1], out)
        return True

    @staticmethod
    def _load(body: str) -> tuple[str, str] | None:
        try:
            return call_from_json(json.loads(body))
        except (json.JSONDecodeError, ValueError):
            return None
