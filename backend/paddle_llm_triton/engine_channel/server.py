"""The llm instance's side of the engine channel: one selector thread owns the listening socket and
every connection (accept, read, write, close); nothing on it blocks and nothing on it calls pb_utils.

One connection carries one engine request. The first frame starts it (`handler.start`); an `abort`
frame or the peer closing its end aborts it (`handler.abort`); the engine's outputs arrive from the
engine thread through `emit` (a queue plus a wake-up byte), are written without blocking, and after
the final one the connection is closed once its bytes are out. A peer that stops reading is cut off
when `max_buffer_bytes` of its output are pending, and its request aborted: a stuck ensemble can
delay nobody else.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol

from paddle_llm_triton.engine_channel import address, wire

log = logging.getLogger(__name__)

Emit = Callable[[dict, bool], None]


class Handler(Protocol):
    """What the server calls on its thread (both must return quickly)."""

    def start(self, msg: dict, emit: Emit) -> str:
        """Start the request of the first frame `msg`; return its engine request id. Outputs go to
        emit(frame, final) from any thread. Raise to refuse it: the exception's text becomes the
        error frame, its `channel_code` attribute (default "internal") the error code."""

    def abort(self, request_id: str) -> None:
        """The peer cancelled or went away: abort the request."""


@dataclass(eq=False)  # hashed by identity (kept in a set)
class _Conn:
    sock: socket.socket
    reader: wire.FrameReader = field(default_factory=wire.FrameReader)
    out: bytearray = field(default_factory=bytearray)
    request_id: str | None = None
    finished: bool = False      # the final frame was queued: close once `out` is written
    closed: bool = False


class ChannelServer:
    """Listens at address.address(model, instance) and serves `handler` (see the module doc)."""

    def __init__(self, model: str, instance: str, handler: Handler, max_buffer_bytes: int = 16 << 20,
                 pid: int | None = None):
        self.addr = address.address(model, instance, pid)
        self.handler = handler
        self.max_buffer_bytes = max_buffer_bytes
        self._sel = selectors.DefaultSelector()
        self._lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._lsock.bind(self.addr)
        self._lsock.listen(256)
        self._lsock.setblocking(False)
        self._sel.register(self._lsock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._pending: queue.SimpleQueue = queue.SimpleQueue()  # (conn, frame dict, final)
        self._conns: set[_Conn] = set()
        self._stop = False
        self._uid = os.getuid()
        self._thread = threading.Thread(target=self._run, name="llm-engine-channel", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving: the thread exits; open connections are closed (their peers see the end)."""
        self._stop = True
        self._wake()
        self._thread.join(timeout)

    # -- any thread -------------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up byte is already pending (or we are closing)

    def _emitter(self, conn: _Conn) -> Emit:
        def emit(frame: dict, final: bool) -> None:
            self._pending.put((conn, frame, final))  # encoded on the selector thread
            self._wake()
        return emit

    # -- the selector thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop:
                for key, ev in self._sel.select(timeout=1.0):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._serve(key.data, ev)
                self._deliver()
        except Exception:
            log.exception("engine channel %r stopped", self.addr[1:])
        finally:
            for conn in list(self._conns):
                self._close(conn, abort=True)
            for s in (self._lsock, self._wake_r, self._wake_w):
                s.close()
            self._sel.close()

    def _serve(self, conn: _Conn, ev: int) -> None:
        try:
            if ev & selectors.EVENT_READ:
                self._read(conn)
            if ev & selectors.EVENT_WRITE and not conn.closed:
                self._flush(conn)
        except Exception:  # a bug on one connection must not stop the others
            log.exception("engine channel: connection of request %s failed; closing it", conn.request_id)
            self._close(conn, abort=not conn.finished)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._lsock.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    log.error("engine channel: cannot accept a connection: %s", e)
                return
            uid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            if uid != self._uid:  # an abstract socket has no file permissions: check the peer
                log.warning("engine channel: refused a connection from uid %d", uid)
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock)
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the peer closed its end (or died): abort what it asked for
            self._close(conn, abort=not conn.finished)
            return
        try:
            frames = conn.reader.feed(data)
        except wire.FrameError as e:
            self._refuse(conn, f"malformed frame: {e}", "invalid_arg")
            return
        for msg in frames:
            self._on_frame(conn, msg)

    def _on_frame(self, conn: _Conn, msg: dict) -> None:
        kind = msg.get("type")
        if kind == "abort":
            if conn.request_id is not None and not conn.finished:
                self.handler.abort(conn.request_id)
            return
        if kind != "generate" or conn.request_id is not None:
            self._refuse(conn, f"unexpected frame {kind!r}", "invalid_arg")
            return
        try:
            conn.request_id = self.handler.start(msg, self._emitter(conn))
        except Exception as e:
            code = getattr(e, "channel_code", "internal")
            if code == "internal":
                log.exception("engine channel: request refused")
            self._refuse(conn, str(e) or type(e).__name__, code)

    def _refuse(self, conn: _Conn, message: str, code: str) -> None:
        if conn.request_id is not None and not conn.finished:
            self.handler.abort(conn.request_id)
        self._queue(conn, wire.encode({"type": "error", "code": code, "message": message}), final=True)

    def _deliver(self) -> None:
        while True:
            try:
                conn, frame, final = self._pending.get_nowait()
            except queue.Empty:
                return
            try:
                data = wire.encode(frame)
            except (wire.FrameError, TypeError, ValueError) as e:
                log.error("engine channel: cannot encode a frame of request %s: %s", conn.request_id, e)
                data, final = wire.encode({"type": "error", "code": "internal", "message": f"bad frame: {e}"}), True
            self._queue(conn, data, final)

    def _queue(self, conn: _Conn, data: bytes, final: bool) -> None:
        if conn.closed or conn.finished:
            return  # the peer left (its request was aborted) or the final frame is already queued
        conn.out += data
        conn.finished = final
        if len(conn.out) > self.max_buffer_bytes:
            log.warning("engine channel: peer of request %s reads nothing (%d bytes pending): closing it",
                        conn.request_id, len(conn.out))
            self._close(conn, abort=not final)
            return
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            while conn.out:
                n = conn.sock.send(conn.out)
                del conn.out[:n]
        except BlockingIOError:
            pass
        except OSError:  # the peer is gone
            self._close(conn, abort=not conn.finished)
            return
        if not conn.out and conn.finished:
            self._close(conn, abort=False)
            return
        self._sel.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0), conn)

    def _close(self, conn: _Conn, abort: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        if abort and conn.request_id is not None:
            self.handler.abort(conn.request_id)
        self._conns.discard(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
