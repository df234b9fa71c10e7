"""Incremental detokenization and stop-string matching for one request's output.

Text deltas come from decoding a short window of tokens before and after the new ones (the
"prefix/read offset" method vLLM uses): decoding the window keeps the word-boundary spaces that
SentencePiece and byte-level BPE tokenizers attach to tokens, and a delta that ends in U+FFFD (a
UTF-8 character split across tokens) is held back until the character completes.

When the model itself emits bytes that are not valid UTF-8 (a truncated character followed by a
new one), the decoder's U+FFFD for them is dropped: no client ever receives U+FFFD, streamed or not.

Stop strings are matched on the accumulated text, so they match across token boundaries; text
that could still be the start of a stop string is held back, and the stop string itself is not
emitted unless the request asks for it (vLLM's include_stop_str_in_output).
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
_CONTEXT_TOKENS = 5  # prompt tokens kept as left context for the first output tokens


class IncrementalDetokenizer:
    """Token ids in, text deltas out. `tokenizer` needs decode(ids, skip_special_tokens=...).

    keep_special: (with skip_special_tokens) special token ids to keep in the text anyway, hide_ids:
    the ids skip_special_tokens would drop; a thinking model whose `<think>` / `</think>` are special
    tokens keeps them, so that the reasoning split sees where the thinking ends."""

    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True, keep_special: frozenset[int] = frozenset(),
                 hide_ids: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self._hide = None  # ids dropped by hand when some special ids must stay
        if skip_special_tokens and keep_special:
            self.skip = False
            self._hide = frozenset(hide_ids) - frozenset(keep_special)
        # the tokenizer's own option (slow tokenizers honour it, fast ones ignore it, as in vLLM);
        # passed only when it differs from the default so that any decode() signature works
        self.kwargs = {} if spaces_between_special_tokens else {"spaces_between_special_tokens": False}
        self.ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        if self._hide is not None:
            ids = [t for t in ids if t not in self._hide]
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip, clean_up_tokenization_spaces=False,
                                     **self.kwargs)

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; return the newly completed text ("" while a character is incomplete)."""
        self.ids.extend(new_ids)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix):].replace(REPLACEMENT, "")
        return ""

    def flush(self) -> str:
        """At the end of generation: the held-back text, minus bytes that never formed a character."""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):].replace(REPLACEMENT, "") if len(full) > len(prefix) else ""


class StopStringMatcher:
    """Holds back text that may start a stop string; reports where a stop string matched.
    include_stop: the text ends with the matched stop string instead of just before it."""

    def __init__(self, stops: list[str], include_stop: bool = False):
        self.stops = [s for s in stops if s]
        self.include_stop = include_stop
        self.max_len = max((len(s) for s in self.stops), default=0)
        self.text = ""      # all text produced so far
        self.emitted = 0    # chars of self.text already returned to the client

    def push(self, delta: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, stopped). On a match the text is cut before it."""
        self.text += delta
        if not self.stops:
            out = self.text[self.emitted:]
            self.emitted = len(self.text)
            return out, False
        # A match can only involve text after (emitted - max_len): earlier text was checked before.
        lo = max(0, self.emitted - self.max_len + 1)
        best, end = -1, -1
        for s in self.stops:
            i = self.text.find(s, lo)
            if i != -1 and (best == -1 or i < best):
                best, end = i, i + len(s)
        if best != -1:
            if self.include_stop:
                best = end
            self.text = self.text[:best]
            out = self.text[self.emitted:] if best > self.emitted else ""
            self.emitted = len(self.text)
            return out, True
        hold = self._partial_suffix()
        safe = len(self.text) - hold
        out = self.text[self.emitted:safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return out, False

    def _partial_suffix(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """Generation ended without a match: release the held-back text."""
        out = self.text[self.emitted:]
        self.emitted = len(self.text)
        return out
