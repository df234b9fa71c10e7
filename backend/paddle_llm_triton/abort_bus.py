"""Forward `stop` request ids between the instances (stub processes) of one Triton model.

Each instance binds a Unix datagram socket in the abstract namespace (Linux; nothing on disk, gone
when the process exits) named after the server process, the model and the instance:
"\\0paddle_llm_stop/<tritonserver pid>/<model>/<instance>". `publish(id)` sends the id to every
sibling named by the model's instance_group (instances.py); a thread in each sibling receives
it and calls `on_stop(id)`. Delivery is best effort: a sibling that is not (yet) listening is
skipped. With one instance nothing is ever sent.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Callable

log = logging.getLogger(__name__)

MAX_ID_BYTES = 4000


def _address(scope: str, instance: str) -> str:
    return f"\0paddle_llm_stop/{scope}/{instance}"


class AbortBus:
    def __init__(self, model_name: str, instance_name: str, peers: list[str], on_stop: Callable[[str], None],
                 server_pid: int | None = None):
        self.scope = f"{server_pid if server_pid is not None else os.getppid()}/{model_name}"
        self.instance_name = instance_name
        self.peers = [p for p in peers if p != instance_name]
        self._on_stop = on_stop
        self._closed = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        try:
            self._sock.bind(_address(self.scope, instance_name))
        except OSError as e:  # e.g. a second server with the same parent pid in another namespace
            log.warning("stop forwarding between instances disabled for %s: %s", instance_name, e)
            self._sock.close()
            self._sock = None
            return
        self._thread = threading.Thread(target=self._run, name="llm-abort-bus", daemon=True)
        self._thread.start()

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def publish(self, request_id: str) -> int:
        """Send request_id to every sibling instance; returns how many accepted it."""
        data = request_id.encode("utf-8")
        if len(data) > MAX_ID_BYTES or not self.peers:
            return 0
        sent = 0
        for peer in self.peers:
            try:
                self._out.sendto(data, _address(self.scope, peer))
                sent += 1
            except OSError:  # not listening (not started, or gone): nothing to abort there
                pass
        return sent

    def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            try:
                # wake the receiver: a datagram to ourselves
                self._out.sendto(b"", _address(self.scope, self.instance_name))
            except OSError:
                pass
            self._thread.join(2)
            self._sock.close()
        self._out.close()

    def _run(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(MAX_ID_BYTES + 1)
            except OSError:
                return
            if self._closed:
                return
            if not data:
                continue
            try:
                self._on_stop(data.decode("utf-8", "replace"))
            except Exception:
                log.exception("forwarded stop failed")
