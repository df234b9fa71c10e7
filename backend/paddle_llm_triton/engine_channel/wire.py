"""Frames of the engine channel: a 4-byte big-endian length, then that many bytes of UTF-8 JSON
holding one object. JSON, not pickle: any local process of the same user can connect to an abstract
socket, and decoding a frame must never run code."""

from __future__ import annotations

import json
import struct

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 << 20  # a prompt of max_model_len ids as JSON stays far below this


class FrameError(ValueError):
    """A frame that cannot be decoded (length over MAX_FRAME_BYTES, not JSON, not an object)."""


def encode(msg: dict) -> bytes:
    """One frame for the JSON object `msg`. Raises FrameError when it is too large."""
    body = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Incremental decoder: feed() bytes as they arrive, get back the complete frames' objects."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        """Append `data`; return every frame completed by it, in order. Raises FrameError."""
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf)
            if n > MAX_FRAME_BYTES:
                raise FrameError(f"frame length {n} exceeds {MAX_FRAME_BYTES}")
            if len(self._buf) < HEADER.size + n:
                break
            body = bytes(self._buf[HEADER.size:HEADER.size + n])
            del self._buf[:HEADER.size + n]
            try:
                msg = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise FrameError(f"frame is not UTF-8 JSON: {e}") from None
            if not isinstance(msg, dict):
                raise FrameError(f"frame holds {type(msg).__name__}, not an object")
            out.append(msg)
        return out
