"""One `llm` request over a gRPC stream of Triton (`tritonclient.grpc.aio`), as an async iterator.

`TritonLLM(url, model).generate(prompt, sampling_parameters, stream, logprobs, request_id)` yields
`Piece`s: text (the new text when streamed, the whole answer otherwise), finish_reason (None until
the last piece, then "stop" / "length" / "abort"), num_input_tokens, num_output_tokens (of this piece
when streamed, of the answer otherwise) and logprobs (llm's per-token entries, or None). With
reasoning=True the request sets `return_reasoning`: text is then the answer only, `reasoning` the
thinking (llm's reasoning_output; "" without a reasoning parser) and num_reasoning_tokens counted
like num_output_tokens; without it `reasoning` is None.

Every request has its own `ModelStreamInfer` call on the shared channel, so ending it early (the
client went away, the iterator is closed or its task cancelled) cancels exactly that call, and
Triton marks the request cancelled: `llm` aborts it and frees its KV blocks within its 0.1 s sweep.
An error response, or the call failing (Triton gone, connection reset), raises `TritonError` with
the message; the endpoints classify it (errors.classify). There is no silent end: a stream that
closes without a final piece raises TritonError too.
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass
from typing import AsyncIterator

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException


_U32 = struct.Struct("<I")
# a load waits for every llm instance (each answers within 10 s, llm/lora_admin.py FANOUT_TIMEOUT_S)
ADMIN_TIMEOUT_S = 60.0


class TritonError(Exception):
    """A request that Triton failed; str() is Triton's / llm's message."""


@dataclass
class Piece:
    text: str
    finish_reason: str | None
    num_input_tokens: int
    num_output_tokens: int
    logprobs: list[dict] | None
    reasoning: str | None = None
    num_reasoning_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens llm found in its prefix cache (every response carries it)


def _tensor(name: str, value, dtype: str) -> grpcclient.InferInput:
    arr = np.array([value], dtype=np.object_ if dtype == "BYTES" else np.bool_)
    t = grpcclient.InferInput(name, [1], dtype)
    t.set_data_from_numpy(arr)
    return t


# gRPC's reconnect back-off grows to 120 s by default: after tritonserver was restarted (the
# supervisor does that when a stub dies), the channel could stay in back-off for ~10 s after the
# server was back, answering 503 meanwhile (the 3-minute soak saw it); capped at 1 s here
RECONNECT_BACKOFF_MS = (("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                        ("grpc.max_reconnect_backoff_ms", 1000))


def channel_args() -> list[tuple[str, int]]:
    """tritonclient's own channel defaults (message sizes, keepalive) plus RECONNECT_BACKOFF_MS."""
    from tritonclient.grpc import KeepAliveOptions
    from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE

    ka = KeepAliveOptions()
    return [("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", ka.keepalive_time_ms), ("grpc.keepalive_timeout_ms", ka.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", ka.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", ka.http2_max_pings_without_data), *RECONNECT_BACKOFF_MS]


class TritonLLM:
    """The gRPC client of one Triton server's `llm` model. Create inside the running event loop."""

    def __init__(self, url: str, model: str = "llm"):
        self.url = url
        self.model = model
        self.client = grpcclient.InferenceServerClient(url, channel_args=channel_args())

    async def close(self) -> None:
        await self.client.close()

    async def is_ready(self) -> bool:
        """Triton ready (false while it drains) and `llm` ready (False on any error: the server may be gone)."""
        try:
            return bool(await self.client.is_server_ready()) and bool(await self.client.is_model_ready(self.model))
        except Exception:
            return False

    async def model_config(self) -> dict:
        """The model's Triton config as JSON (the model-config API; {} when it cannot be read)."""
        try:
            return dict((await self.client.get_model_config(self.model, as_json=True)).get("config") or {})
        except Exception:
            return {}

    async def is_model_ready(self) -> bool:
        """The model is ready (False on any error: the server may be gone)."""
        try:
            return bool(await self.client.is_model_ready(self.model))
        except Exception:
            return False

    async def is_live(self) -> bool:
        try:
            return bool(await self.client.is_server_live())
        except Exception:
            return False

    async def generate(self, prompt: str, sampling_parameters: dict, stream: bool, logprobs: bool = False,
                       request_id: str = "", reasoning: bool = False) -> AsyncIterator[Piece]:
        inputs = [
            _tensor("text_input", prompt.encode("utf-8"), "BYTES"),
            _tensor("stream", stream, "BOOL"),
            _tensor("sampling_parameters", json.dumps(sampling_parameters).encode("utf-8"), "BYTES"),
            _tensor("exclude_input_in_output", True, "BOOL"),
            _tensor("return_finish_reason", True, "BOOL"),
            _tensor("return_num_input_tokens", True, "BOOL"),
            _tensor("return_num_output_tokens", True, "BOOL"),
            _tensor("return_num_cached_tokens", True, "BOOL"),
        ]
        if logprobs:
            inputs.append(_tensor("return_logprobs", True, "BOOL"))
        if reasoning:
            inputs.append(_tensor("return_reasoning", True, "BOOL"))
        done = asyncio.Event()

        async def requests():
            yield {"model_name": self.model, "inputs": inputs, "request_id": request_id}
            await done.wait()  # keep our half of the stream open until the last response

        call = self.client.stream_infer(requests())
        finished = False
        try:
            async for result, error in call:
                if error is not None:
                    raise _stream_error(error)
                piece = _piece(result)
                if piece.finish_reason is not None:
                    finished = True
                yield piece
                if finished:
                    return
            raise TritonError(f"the gRPC stream of {self.model} ended without a final response")
        except (grpc.aio.AioRpcError, InferenceServerException) as e:
            raise _transport_error(e) from None
        finally:
            done.set()
            if not finished:
                call.cancel()  # the client went away or the request failed: Triton cancels the request


    async def admin(self, payload: dict, timeout: float = ADMIN_TIMEOUT_S) -> dict:
        """One `lora_admin` request (llm's runtime LoRA list / load / unload, paddle_llm_triton/llm/
        lora_admin.py): its JSON result. TritonError with llm's message ("<field>: <reason>") when it
        refuses, or with the transport's when the call fails."""
        inputs = [_tensor("lora_admin", json.dumps(payload).encode("utf-8"), "BYTES")]
        done = asyncio.Event()

        async def requests():
            yield {"model_name": self.model, "inputs": inputs}
            await done.wait()

        call = self.client.stream_infer(requests())
        answered = []

        async def first():
            async for result, error in call:
                answered.append(True)
                if error is not None:
                    raise _stream_error(error)
                text = result.as_numpy("text_output")
                return json.loads(text.reshape(-1)[0]) if text is not None and text.size else {}
            raise TritonError(f"the gRPC stream of {self.model} ended without a response")

        try:
            return await asyncio.wait_for(first(), timeout)
        except asyncio.TimeoutError:
            raise TritonError(f"lora_admin: no answer from {self.model} within {timeout:g} s") from None
        except (grpc.aio.AioRpcError, InferenceServerException) as e:
            raise _transport_error(e) from None
        finally:
            done.set()
            if not answered:
                call.cancel()


def _stream_error(error) -> TritonError:
    """A stream's error response (Triton's message) as a TritonError."""
    return TritonError(error.message() if isinstance(error, InferenceServerException) else str(error))


def _transport_error(e) -> TritonError:
    """A failed gRPC call (grpc.aio.AioRpcError or tritonclient's InferenceServerException) as a
    TritonError naming its status."""
    if isinstance(e, grpc.aio.AioRpcError):
        return TritonError(f"StatusCode.{e.code().name}: {e.details()}")
    return TritonError(f"{e.status() or ''} {e.message()}".strip())


def _piece(result) -> Piece:
    """One llm response -> Piece, read straight from the protobuf's raw outputs (every output here
    has one element: BYTES as a 4-byte little-endian length + the bytes, UINT32 as 4 bytes), which
    costs a fraction of tritonclient's as_numpy per output; the as_numpy path remains for a response
    without raw contents."""
    resp = result.get_response()
    raw = resp.raw_output_contents
    if len(raw) != len(resp.outputs):
        return _piece_numpy(result)
    v = {}
    for out, b in zip(resp.outputs, raw):
        if out.datatype == "BYTES":
            n = _U32.unpack_from(b, 0)[0] if len(b) >= 4 else 0
            v[out.name] = b[4:4 + n]
        elif out.datatype == "UINT32":
            v[out.name] = _U32.unpack_from(b, 0)[0] if len(b) >= 4 else 0
    return _make(v.get("text_output"), v.get("finish_reason"), v.get("logprobs"), v.get("num_input_tokens"),
                 v.get("num_output_tokens"), v.get("reasoning_output"), v.get("num_reasoning_tokens"),
                 v.get("num_cached_tokens"))


def _piece_numpy(result) -> Piece:
    def first(name):
        a = result.as_numpy(name)
        return None if a is None or a.size == 0 else a.reshape(-1)[0]

    return _make(first("text_output"), first("finish_reason"), first("logprobs"), first("num_input_tokens"),
                 first("num_output_tokens"), first("reasoning_output"), first("num_reasoning_tokens"),
                 first("num_cached_tokens"))


def _text(b) -> str | None:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


def _make(text, reason, lp, n_in, n_out, reasoning=None, n_reasoning=None, n_cached=None) -> Piece:
    reason = reason.decode() if isinstance(reason, bytes) else reason
    return Piece(text=_text(text) or "", finish_reason=None if reason in (None, "None") else reason,
                 num_input_tokens=int(n_in or 0), num_output_tokens=int(n_out or 0),
                 logprobs=json.loads(lp) if lp is not None else None, reasoning=_text(reasoning),
                 num_reasoning_tokens=int(n_reasoning or 0), num_cached_tokens=int(n_cached or 0))
