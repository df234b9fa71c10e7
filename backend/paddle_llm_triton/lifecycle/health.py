"""The llm instance's stall watchdog: an engine step, or one response send to Triton, that has not
returned within `max_step_s` seconds marks the engine failed (EngineLoop.declare_failed): the
requests in flight get an error naming the stall, llm_engine_healthy drops to 0 and the launcher's
supervisor reloads the model. A stuck thread cannot be interrupted in Python; this turns "stuck
forever with readiness 200" into a failure that is reported and recovered from.
The same thread asks `liveness()` every poll: a tensor-parallel worker that died while the engine
was idle (no step to notice it) is a failure at once, not at the next request.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class StallWatchdog:
    """Checks every `poll_s` seconds. probes: name -> callable returning the time.monotonic() at which
    the watched operation started, or None when none is running (judged only when max_step_s > 0);
    liveness: callable returning why a part of the engine is dead (e.g. the executor's
    dead_worker()), or None. declare(reason) is called once."""

    def __init__(self, probes: dict[str, Callable[[], float | None]], declare: Callable[[str], bool],
                 max_step_s: float, poll_s: float = 1.0, liveness: Callable[[], str | None] | None = None):
        self.probes = probes
        self.liveness = liveness
        self.declare = declare
        self.max_step_s = max_step_s
        self.poll_s = poll_s
        self._stop = threading.Event()
        self.fired: str | None = None
        self._thread = None
        if max_step_s > 0 or liveness is not None:
            self._thread = threading.Thread(target=self._run, name="llm-stall-watchdog", daemon=True)
            self._thread.start()

    def check(self, now: float | None = None) -> str | None:
        """One check; returns the reason when it fired."""
        now = time.monotonic() if now is None else now
        dead = self.liveness() if self.liveness is not None else None
        if dead is not None:
            reason = f"{dead} (seen by the watchdog between steps)"
            if self.declare(reason):
                log.error("watchdog: %s", reason)
            self.fired = reason
            return reason
        for name, started in self.probes.items() if self.max_step_s > 0 else ():
            t = started()
            if t is not None and now - t > self.max_step_s:
                reason = (f"{name} has not returned for {now - t:.0f} s (max_step_seconds {self.max_step_s:.0f}): "
                          f"the instance is considered stuck")
                if self.declare(reason):
                    log.error("stall watchdog: %s", reason)
                self.fired = reason
                return reason
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.check() is not None:
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
