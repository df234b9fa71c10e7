"""What a request's sequences produced since their last response, and when that is worth a response.

Both response paths use it: `llm`'s responder (Triton responses to direct clients) and the engine
channel's handler (frames to the `ensemble`). Streaming: a response as soon as a sequence has text
(held-back characters or stop-string prefixes ride along with the next text) or when it ends.
Non-streamed: one response per sequence, when it ends. A caller that already holds the sequence's
next output (a stream that fell behind: several engine steps queued before its response went out)
passes hold=True, and the text of both goes out in one response with the later output's state. A non-streamed answer can start with the
prompt text (exclude_input_in_output false): `prompt_text` goes before the first flush of each
sequence.

stream_interval N (vLLM's and SGLang's `stream_interval`, the `llm` parameter of that name): after a
sequence's first streamed response, the next goes out once N tokens have accumulated since the
previous one (or the sequence ends). N = 1 (the default) is one response per token. Each response
costs the same at every hop whatever it carries (an IPC round trip to tritonserver, a gRPC or SSE
message, the client's own parsing), so under load N > 1 divides that cost by N; the first token is
never held, so TTFT is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paddle_llm_engine.outputs import RequestOutput


@dataclass
class Flush:
    """One response's worth of one sequence: text (prompt text included where it applies), the token
    ids and their (logprob, top alternatives) entries since the previous flush. With a reasoning
    parser (RequestOutput.reasoning_text set): reasoning / content, the thinking and answer parts of
    `text` (the prompt text goes before content), num_reasoning_tokens (the sequence's so far) and
    reasoning_tokens (those since the previous flush); reasoning and content are None without one."""

    text: str
    ids: list[int]
    logprobs: list
    first: bool  # the sequence's first flush
    reasoning: str | None = None
    content: str | None = None
    num_reasoning_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass
class _Seq:
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    flushed: bool = False
    reasoning: list[str] | None = None  # with a reasoning parser: the parts since the last flush
    content: list[str] | None = None
    n_reasoning: int = 0  # the sequence's reasoning tokens: latest, and at the last flush
    n_reasoning_sent: int = 0


class SequenceBuffers:
    """Per-sequence buffers of one request (the engine's RequestOutput deltas in, Flushes out).

    stream_interval: tokens per streamed response after the first (>= 1; see the module doc).
    Raises ValueError for stream_interval < 1."""

    def __init__(self, stream: bool, prompt_text: str | None = None, stream_interval: int = 1):
        if int(stream_interval) < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval!r}")
        self.stream = stream
        self.prompt_text = prompt_text
        self.stream_interval = int(stream_interval)
        self._seqs: dict[int, _Seq] = {}

    def add(self, out: RequestOutput, hold: bool = False) -> Flush | None:
        """Take one output; return what to send now for its sequence, or None to wait. hold: a later
        output of this sequence is already at hand, so a streamed flush waits for it (an output that
        ends the sequence flushes regardless)."""
        s = self._seqs.get(out.sequence_index)
        if s is None:
            s = self._seqs[out.sequence_index] = _Seq()
        s.text.append(out.text)
        s.ids.extend(out.token_ids)
        s.logprobs.extend(out.logprobs)
        if out.reasoning_text is not None:
            if s.reasoning is None:
                s.reasoning, s.content = [], []
            s.reasoning.append(out.reasoning_text)
            s.content.append(out.content_text or "")
            s.n_reasoning = out.num_reasoning_tokens
        text = "".join(s.text)
        due = not s.flushed or len(s.ids) >= self.stream_interval
        if not (out.sequence_finished or (self.stream and text and due and not hold)):
            return None
        reasoning = content = None
        if s.reasoning is not None:
            reasoning, content = "".join(s.reasoning), "".join(s.content)
            s.reasoning, s.content = [], []
        if not s.flushed and self.prompt_text is not None:
            text = self.prompt_text + text
            content = self.prompt_text + content if content is not None else None
        flush = Flush(text, s.ids, s.logprobs, first=not s.flushed, reasoning=reasoning, content=content,
                      num_reasoning_tokens=s.n_reasoning, reasoning_tokens=s.n_reasoning - s.n_reasoning_sent)
        s.text, s.ids, s.logprobs, s.flushed, s.n_reasoning_sent = [], [], [], True, s.n_reasoning
        return flush
