"""Every Triton response sender a stub takes, until its FINAL response: a count by request kind.

A decoupled request holds its model in Triton until the FINAL response is sent on its sender (the
response factory holds the model): one forgotten sender keeps the model from ever unloading, which
turns a clean drain into a killed server. So every model takes its senders through `SenderLedger.track`,
and the drain status reports what is still open (drain.py), named by kind.
"""

from __future__ import annotations

import threading
from collections import Counter


class TrackedSender:
    """A pb_utils response sender that tells its ledger when its FINAL response went out."""

    __slots__ = ("_sender", "_ledger", "kind", "_final")

    def __init__(self, sender, ledger: "SenderLedger", kind: str):
        self._sender, self._ledger, self.kind, self._final = sender, ledger, kind, False

    def send(self, response=None, flags: int = 0) -> None:
        final = bool(flags & 1)  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            self._sender.send(response, flags=flags)
        finally:
            if final and not self._final:  # a FINAL that raised still closed the sender in the stub
                self._final = True
                self._ledger._closed(self.kind)

    def is_cancelled(self) -> bool:
        return self._sender.is_cancelled()


class SenderLedger:
    """Thread-safe counts of senders taken and not finished, by kind."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: Counter = Counter()

    def track(self, sender, kind: str) -> TrackedSender:
        with self._lock:
            self._open[kind] += 1
        return TrackedSender(sender, self, kind)

    def _closed(self, kind: str) -> None:
        with self._lock:
            self._open[kind] -= 1
            if self._open[kind] <= 0:
                del self._open[kind]

    def open_by_kind(self) -> dict[str, int]:
        with self._lock:
            return dict(self._open)

    @property
    def open(self) -> int:
        with self._lock:
            return sum(self._open.values())
