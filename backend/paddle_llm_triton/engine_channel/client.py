"""The ensemble's side of the engine channel: find the listening llm instances, open one connection
per engine request on the least loaded of them, read its frames, cancel it.

Frames are read on the thread that opened the stream (the ensemble's request thread); `cancel()`
may be called from any other thread (a socket sends and receives independently).
"""

from __future__ import annotations

import itertools
import socket
import threading
import time

from paddle_llm_triton.engine_channel import address, wire


class ChannelUnavailable(ConnectionError):
    """No instance of the model accepts connections (not loaded yet, unloaded, or restarting)."""


class ChannelClosed(ConnectionError):
    """The llm instance closed the connection before the request's final frame (its stub process
    died, or the model was unloaded)."""


class ChannelStream:
    """One engine request on its own connection to `instance`."""

    def __init__(self, sock: socket.socket, instance: str, on_close):
        self.sock = sock
        self.instance = instance
        self._reader = wire.FrameReader()
        self._frames: list[dict] = []
        self._on_close = on_close
        self._closed = False
        self._cancel_lock = threading.Lock()
        self.done = False

    def next(self, timeout: float) -> dict:
        """The next frame, waiting at most `timeout` seconds (TimeoutError). The frame that ends the
        request (an `error` frame, or an `output` frame with finished true) is the last one.
        Raises ChannelClosed when the instance goes away first, wire.FrameError on garbage."""
        deadline = time.monotonic() + timeout
        while not self._frames:
            if self.done:
                raise ChannelClosed(f"llm instance {self.instance}: the request already ended")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"llm instance {self.instance} sent nothing for {timeout:.1f} s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError as e:
                data, why = b"", f" ({e})"
            else:
                why = ""
            if not data:
                self.close()
                raise ChannelClosed(f"llm instance {self.instance} closed its engine channel before the request "
                                    f"finished{why}: its stub process died or the model was unloaded")
            self._frames.extend(self._reader.feed(data))
        return self._pop()

    def take_ready(self) -> dict | None:
        """The next frame if it has already arrived (what the socket holds now is read without
        waiting), else None. A closed connection is left for next() to report."""
        if not self._frames and not self.done and not self._closed:
            try:
                self.sock.settimeout(0.0)
                data = self.sock.recv(1 << 16)
            except OSError:  # nothing there (BlockingIOError), or gone: next() says which
                data = b""
            if data:
                self._frames.extend(self._reader.feed(data))
        return self._pop() if self._frames else None

    def _pop(self) -> dict:
        frame = self._frames.pop(0)
        if frame.get("type") == "error" or frame.get("finished"):
            self.done = True
            self.close()
        return frame

    def cancel(self) -> None:
        """Ask the instance to abort the request (it answers with the request's last frames)."""
        with self._cancel_lock:
            if self._closed or self.done:
                return
            try:
                self.sock.sendall(wire.encode({"type": "abort"}))
            except OSError:
                pass  # already gone: the instance aborts on the closed connection anyway

    def close(self) -> None:
        """Drop the connection (the instance aborts the request if it is still running)."""
        with self._cancel_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.sock.close()
        finally:
            self._on_close(self.instance)


class ChannelClient:
    """Opens engine requests on the instances of `model` (see the module doc). Thread-safe."""

    def __init__(self, model: str = "llm", pid: int | None = None, rescan_s: float = 1.0,
                 connect_timeout_s: float = 5.0):
        self.model = model
        self._pid = pid
        self.rescan_s = rescan_s
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()
        self._instances: list[str] = []
        self._scanned_at = -1e9
        self._load: dict[str, int] = {}  # instance -> streams open from here
        self._rr = itertools.count()

    def instances(self, rescan: bool = False) -> list[str]:
        """The listening instances (re-read at most every rescan_s, or now with `rescan`)."""
        with self._lock:
            now = time.monotonic()
            if rescan or now - self._scanned_at >= self.rescan_s or not self._instances:
                self._instances = address.listening_instances(self.model, self._pid)
                self._scanned_at = now
            return list(self._instances)

    def _order(self, instances: list[str]) -> list[str]:
        """Least loaded first; ties rotate so that idle instances share the work."""
        with self._lock:
            k = next(self._rr)
            n = len(instances)
            return sorted(instances, key=lambda i: (self._load.get(i, 0), (instances.index(i) - k) % n))

    def _release(self, instance: str) -> None:
        with self._lock:
            self._load[instance] = max(0, self._load.get(instance, 0) - 1)

    def open(self, request: dict, prefer: str | None = None) -> ChannelStream:
        """Send the `generate` frame `request` to the least loaded listening instance (`prefer` first
        when it is listening: the one holding what the request needs, e.g. its LoRA task) and return
        its stream. An instance that refuses the connection is skipped. Raises ChannelUnavailable
        when none accepts it."""
        tried: list[str] = []
        for attempt in range(2):  # the second pass re-reads the socket table (an instance restarted)
            order = self._order(self.instances(rescan=attempt > 0))
            if prefer in order:
                order.remove(prefer)
                order.insert(0, prefer)
            for inst in order:
                if inst in tried:
                    continue
                tried.append(inst)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.connect_timeout_s)
                try:
                    sock.connect(address.address(self.model, inst, self._pid))
                    sock.sendall(wire.encode(request))
                except OSError:
                    sock.close()
                    continue
                with self._lock:
                    self._load[inst] = self._load.get(inst, 0) + 1
                return ChannelStream(sock, inst, self._release)
        raise ChannelUnavailable(f"no instance of model '{self.model}' is serving"
                                 + (f" (tried {', '.join(tried)})" if tried else " (none is loaded)")
                                 + ": it is loading or restarting; retry")
