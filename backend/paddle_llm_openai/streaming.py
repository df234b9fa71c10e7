"""The n sequences of one OpenAI request as one stream of (index, Piece), and SSE framing.

`merged(gens)`: the pieces of several `llm` requests in arrival order, tagged with their index
(n = 1 iterates the one generator directly, with no task). Closing the merged iterator, or an error
in any sequence, cancels every sequence still running (each one's gRPC call is cancelled, so `llm`
frees its KV). `collect(gens)` runs them to the end for a non-streamed answer.

SSE: `sse(obj)` is one `data: <json>\\n\\n` event; the stream ends with `data: [DONE]\\n\\n`
(OPENAI_DONE), as OpenAI does; an error after the first event is sent as one `data: {"error": ...}`
event before [DONE] (the status line is already 200), as vLLM does.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterable

from paddle_llm_openai.errors import classify
from paddle_llm_openai.triton_client import Piece, TritonError

DONE = b"data: [DONE]\n\n"
_END = object()


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


async def open_stream(gens: list[AsyncIterator[Piece]], names: dict):
    """(the merged pieces of gens, the first (index, Piece)), awaited before the response starts, so
    that an error the first `llm` response reports is raised as its OpenAIError (errors.classify with
    the request's parameter names) and answered with its own status."""
    pieces = merged(gens)
    try:
        return pieces, await pieces.__anext__()
    except TritonError as e:
        await pieces.aclose()
        raise classify(str(e), names) from None


async def relay(first, pieces, handle: Callable[[int, Piece], Iterable[bytes]], names: dict,
                usage: Callable[[], bytes | None]) -> AsyncIterator[bytes]:
    """SSE bytes of a response stream after its first events: handle(index, piece) -> the events of
    each piece (`first` included), then usage() (an event or None) and [DONE]. A Triton error after
    the status line went out becomes one error event and [DONE]; `pieces` is closed in every case
    (which cancels the sequences still running)."""
    try:
        item = first
        while True:
            for event in handle(*item):
                yield event
            try:
                item = await pieces.__anext__()
            except StopAsyncIteration:
                break
    except TritonError as e:
        yield sse(classify(str(e), names).body())
        yield DONE
        return
    finally:
        await pieces.aclose()
    tail = usage()
    if tail is not None:
        yield tail
    yield DONE


async def merged(gens: list[AsyncIterator[Piece]]) -> AsyncIterator[tuple[int, Piece]]:
    if len(gens) == 1:
        gen = gens[0]
        try:
            async for piece in gen:
                yield 0, piece
        finally:
            await gen.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen):
        try:
            async for piece in gen:
                await queue.put((i, piece))
            await queue.put((i, _END))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001  (passed on to the consumer)
            await queue.put((i, e))
        finally:
            await gen.aclose()

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    left = len(tasks)
    try:
        while left:
            i, item = await queue.get()
            if item is _END:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Sequence:
    """A finished sequence: the text, finish reason, token counts and logprob entries; with the
    reasoning split (Piece.reasoning set) the thinking text and its token count."""

    text: str = ""
    finish_reason: str | None = None
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    logprobs: list[dict] | None = None
    pieces: list[str] = field(default_factory=list)
    reasoning: str | None = None
    num_reasoning_tokens: int = 0
    num_cached_tokens: int = 0

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece.text)
        if piece.reasoning is not None:
            self.reasoning = (self.reasoning or "") + piece.reasoning
            self.num_reasoning_tokens += piece.num_reasoning_tokens
        self.num_input_tokens = piece.num_input_tokens or self.num_input_tokens
        self.num_cached_tokens = piece.num_cached_tokens or self.num_cached_tokens
        self.num_output_tokens += piece.num_output_tokens
        if piece.logprobs is not None:
            self.logprobs = (self.logprobs or []) + piece.logprobs
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason
            self.text = "".join(self.pieces)


async def collect(gens: list[AsyncIterator[Piece]]) -> list[Sequence]:
    """Every sequence to its end (non-streamed requests: each gen yields its answer in one piece)."""
    seqs = [Sequence() for _ in gens]
    async for i, piece in merged(gens):
        seqs[i].add(piece)
    return seqs
