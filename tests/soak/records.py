"""What the soak remembers: one `Outcome` per client request, and timeline `Event`s (faults,
crashes, restarts, failures seen live). Times are time.monotonic() seconds; the report turns them
into seconds since the soak started. Thread-safe."""

from __future__ import annotations

import dataclasses
import threading
import time


@dataclasses.dataclass
class Outcome:
    """One request as a client saw it.

    status: ok (ended normally) | cancelled (the client cancelled / closed it, as planned) |
    error (the server answered an error) | stall (no response for the stall bound, or the request's
    time-out) | malformed (the responses broke the contract: `problems` says how).
    expect: what the scenario required: "ok", "cancel", "invalid_arg:<field>", "unavailable".
    times / tokens: arrival of each response that carried tokens, and how many it carried."""

    scenario: str
    model: str
    protocol: str  # grpc | http
    client: str
    request_id: str
    expect: str = "ok"
    t_send: float = dataclasses.field(default_factory=time.monotonic)  # reset at the actual send
    t_end: float = 0.0
    times: list = dataclasses.field(default_factory=list)
    tokens: list = dataclasses.field(default_factory=list)
    status: str = "ok"
    error: str | None = None
    problems: list = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    text: str = ""
    http_status: int | None = None
    ref_key: str | None = None  # greedy requests: the same key must give the same text
    lora: str | None = None  # the LoRA adapter the request named (llm's lora_name), None: the base model

    @property
    def ttft(self) -> float | None:
        """Seconds from the send to the first response that carried tokens (None without one)."""
        return self.times[0] - self.t_send if self.times else None

    def itl(self) -> list[float]:
        """Inter-token latencies, seconds per token, one sample per token after the first response."""
        out = []
        for k in range(1, len(self.times)):
            n = max(int(self.tokens[k]), 1)
            out.extend([(self.times[k] - self.times[k - 1]) / n] * n)
        return out


@dataclasses.dataclass
class Event:
    """A timeline entry. kind: fault (injected) | crash | wedge | unhealthy | restart | note."""

    t: float
    kind: str
    what: str
    detail: dict = dataclasses.field(default_factory=dict)


class Recorder:
    """Outcomes and events of one soak run."""

    def __init__(self):
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self.outcomes: list[Outcome] = []
        self.events: list[Event] = []

    def add(self, outcome: Outcome) -> None:
        """Store one request's outcome."""
        with self._lock:
            self.outcomes.append(outcome)

    def event(self, kind: str, what: str, t: float | None = None, **detail) -> Event:
        """Store a timeline event (t: monotonic seconds, default now) and print it as it happens."""
        ev = Event(time.monotonic() if t is None else t, kind, what, detail)
        with self._lock:
            self.events.append(ev)
        print(f"[soak +{ev.t - self.t0:7.1f}s] {kind}: {what}", flush=True)
        return ev

    def snapshot(self) -> tuple[list[Outcome], list[Event]]:
        """(outcomes, events) so far (copies)."""
        with self._lock:
            return list(self.outcomes), list(self.events)

    def rel(self, t: float | None) -> float | None:
        """Seconds since the soak started, rounded to ms (None stays None)."""
        return None if t is None else round(t - self.t0, 3)
