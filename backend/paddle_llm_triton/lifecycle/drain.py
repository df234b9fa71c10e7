"""Drain: a stub stops taking new requests and lets those in flight finish, for at most a grace period.

The launcher sends {"type": "drain", "grace_s": N} to every stub's control socket (engine_channel/control_bus.py)
when it is asked to stop. From then on `refuse_if_draining()` raises DrainingError (the models answer
UNAVAILABLE, so clients retry elsewhere), requests already running go on, and when the grace period
ends with requests still in flight `on_deadline(message)` ends them with an error. `status()` is the
reply to the launcher's {"type": "status"} polls; it stops polling once every stub reports 0 in flight
(requests of the engine, and Triton response senders not yet FINAL: senders.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class DrainingError(RuntimeError):
    """A new request arrived while the server drains (mapped to Triton UNAVAILABLE)."""


class Drain:
    """in_flight(): requests of this stub not finished yet; on_deadline(message): end them all with
    that error (called once, on a timer thread, only if some are still in flight)."""

    def __init__(self, model: str, instance: str, in_flight: Callable[[], int],
                 on_deadline: Callable[[str], None] | None = None,
                 open_responses: Callable[[], dict] | None = None):
        self.model, self.instance = model, instance
        self._in_flight = in_flight
        self._open_responses = open_responses or dict
        self._on_deadline = on_deadline
        self.draining = False
        self.deadline: float | None = None
        self._lock = threading.Lock()

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise DrainingError(f"{self.model} instance {self.instance} is shutting down and takes no new requests; "
                                f"retry on another replica")

    def start(self, grace_s: float) -> None:
        """Begin draining (idempotent: a second call keeps the first deadline)."""
        with self._lock:
            if self.draining:
                return
            self.draining = True
            self.deadline = time.monotonic() + max(0.0, float(grace_s))
        log.info("%s: draining: %d request(s) in flight, grace period %.0f s", self.instance, self._in_flight(),
                 grace_s)
        threading.Thread(target=self._expire, args=(float(grace_s),), name="drain-deadline", daemon=True).start()

    def _expire(self, grace_s: float) -> None:
        while time.monotonic() < self.deadline:
            if self._in_flight() == 0:
                return  # done before the deadline; nothing to end
            time.sleep(0.05)
        left = self._in_flight()
        if left and self._on_deadline is not None:
            log.warning("%s: drain grace period of %.0f s over: ending %d request(s) still in flight", self.instance,
                        grace_s, left)
            self._on_deadline(f"the server shut down before the request finished (drain grace period {grace_s:.0f} s)")

    # control-bus handlers
    def on_drain(self, msg: dict) -> dict:
        self.start(float(msg.get("grace_s", 30.0)))
        return self.status()

    def status(self, _msg: dict | None = None) -> dict:
        return {"type": "status", "model": self.model, "instance": self.instance, "draining": self.draining,
                "in_flight": self._in_flight(), "open_responses": self._open_responses()}
