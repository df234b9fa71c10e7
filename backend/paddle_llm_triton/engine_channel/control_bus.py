"""Control datagrams between the processes of one server: `stop` request ids among the instances of
the llm model, and the launcher's `drain` / `status` to every stub of ours.

Each stub process of ours binds a Unix datagram socket in the abstract namespace (unix_names.py)
"\\0paddle_llm_ctl/<tritonserver pid>/<model>/<instance>"; a thread receives JSON datagrams
{"type": ..., ...} and calls the handler registered for that type. A handler may return a dict: it
is sent back to the sender's address (the launcher binds one to ask). Delivery is best effort: a
peer that is not (yet) listening is skipped.
- {"type": "stop", "id": Triton request id}: abort the requests in flight under that id
  (llm/stop_requests.py), published by the instance that received the stop to its siblings;
- {"type": "drain", "grace_s": seconds}: refuse new requests from now on, abort those still running
  after grace_s (lifecycle/drain.py); {"type": "status"} answers {"type": "status", "instance", "draining",
  "in_flight"} (the launcher polls it to know when the drain is done).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Callable

from paddle_llm_triton.engine_channel.unix_names import accept_credentials, bound_names, recv_same_user

log = logging.getLogger(__name__)

PREFIX = "paddle_llm_ctl"
MAX_DATAGRAM = 8192
Handler = Callable[[dict], "dict | None"]


def address(server_pid: int, model: str, instance: str) -> str:
    return f"\0{PREFIX}/{server_pid}/{model}/{instance}"


def bound_instances(server_pid: int) -> list[tuple[str, str]]:
    """(model, instance) of every control socket bound under server `server_pid` now."""
    out = []
    for rest in bound_names(f"{PREFIX}/{server_pid}/"):
        model, _, instance = rest.partition("/")
        if model and instance and "/" not in instance:
            out.append((model, instance))
    return out


class ControlBus:
    """The control socket of one stub instance (see the module doc). `peers`: the sibling instance
    names of the same model that `publish` reaches."""

    def __init__(self, model_name: str, instance_name: str, handlers: dict[str, Handler],
                 peers: list[str] = (), server_pid: int | None = None):
        self.server_pid = os.getppid() if server_pid is None else server_pid
        self.model_name = model_name
        self.instance_name = instance_name
        self.peers = [p for p in peers if p != instance_name]
        self.handlers = dict(handlers)
        self._closed = False
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        try:
            self._sock.bind(address(self.server_pid, model_name, instance_name))
            accept_credentials(self._sock)
        except OSError as e:  # e.g. a second server with the same parent pid in another namespace
            log.warning("control socket disabled for %s: %s", instance_name, e)
            self._sock.close()
            self._sock = None
            return
        self._thread = threading.Thread(target=self._run, name="llm-control-bus", daemon=True)
        self._thread.start()

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def publish(self, msg: dict) -> int:
        """Send `msg` to every sibling instance; returns how many accepted it."""
        data = json.dumps(msg).encode("utf-8")
        if len(data) > MAX_DATAGRAM or not self.peers:
            return 0
        sent = 0
        for peer in self.peers:
            try:
                self._out.sendto(data, address(self.server_pid, self.model_name, peer))
                sent += 1
            except OSError:  # not listening (not started, or gone): nothing to do there
                pass
        return sent

    def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            try:  # wake the receiver: a datagram to ourselves
                self._out.sendto(b"", address(self.server_pid, self.model_name, self.instance_name))
            except OSError:
                pass
            self._thread.join(2)
            self._sock.close()
        self._out.close()

    def _run(self) -> None:
        while not self._closed:
            try:
                got = recv_same_user(self._sock, MAX_DATAGRAM)
            except OSError:
                return
            if self._closed:
                return
            if got is None:
                log.warning("control socket of %s: ignored a datagram from another user", self.instance_name)
                continue
            data, sender = got
            if not data:
                continue
            try:
                msg = json.loads(data.decode("utf-8"))
                handler = self.handlers.get(msg.get("type")) if isinstance(msg, dict) else None
                if handler is None:
                    log.warning("control socket of %s: ignored %r", self.instance_name, data[:200])
                    continue
                reply = handler(msg)
                if reply is not None and sender:
                    self._out.sendto(json.dumps(reply).encode("utf-8"), sender)
            except Exception:
                log.exception("control message %r failed", data[:200])


def ask(server_pid: int, targets: list[tuple[str, str]], msg: dict, timeout: float = 2.0) -> dict:
    """Send `msg` to every (model, instance) in `targets` and collect their replies for at most
    `timeout` seconds: {(model, instance): reply}. Missing keys did not answer in time."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(f"\0{PREFIX}-client/{os.getpid()}/{threading.get_ident()}/{time.monotonic_ns()}")
    accept_credentials(sock)
    try:
        data = json.dumps(msg).encode("utf-8")
        for model, inst in targets:
            try:
                sock.sendto(data, address(server_pid, model, inst))
            except OSError:
                pass
        replies: dict = {}
        deadline = time.monotonic() + timeout
        while len(replies) < len(targets):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                got = recv_same_user(sock, MAX_DATAGRAM)
            except socket.timeout:
                break
            if got is None:
                continue
            raw = got[0]
            try:
                reply = json.loads(raw.decode("utf-8"))
                replies[(reply.get("model"), reply.get("instance"))] = reply
            except (ValueError, AttributeError):
                continue
        return replies
    finally:
        sock.close()
