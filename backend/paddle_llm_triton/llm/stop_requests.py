"""`stop` requests (TensorRT-LLM style): a request carrying `stop` = true and the Triton request id
of a running request aborts that request.

Each `llm` instance keeps the Triton request ids of its requests in flight (`StopRegistry`). A stop
request can reach any instance of the model (Triton routes it like any request), so the instance
that receives it aborts its own matches and forwards the id to its sibling instances as a `stop`
message on the control bus (engine_channel/control_bus.py), which abort theirs. Ids are matched
exactly; every request in flight with that id is aborted (request ids should be unique among requests
in flight for stop to be precise).
"""

from __future__ import annotations

import threading
from typing import Callable


class StopRegistry:
    """Triton request id -> engine request ids of this instance. Thread-safe."""

    def __init__(self, abort: Callable[[str], None]):
        self._abort = abort
        self._by_triton_id: dict[str, set[str]] = {}
        self._triton_id: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, triton_id: str, engine_id: str) -> None:
        if not triton_id:
            return
        with self._lock:
            self._by_triton_id.setdefault(triton_id, set()).add(engine_id)
            self._triton_id[engine_id] = triton_id

    def remove(self, engine_id: str) -> None:
        with self._lock:
            tid = self._triton_id.pop(engine_id, None)
            if tid is None:
                return
            ids = self._by_triton_id.get(tid)
            if ids is not None:
                ids.discard(engine_id)
                if not ids:
                    del self._by_triton_id[tid]

    def stop(self, triton_id: str) -> int:
        """Abort every request in flight here under `triton_id`; returns how many."""
        with self._lock:
            ids = list(self._by_triton_id.get(triton_id, ()))
        for rid in ids:
            self._abort(rid)
        return len(ids)

    def __len__(self) -> int:
        return len(self._triton_id)


class StopRequests:
    """The registry of this instance plus the forwarding to its siblings (see the module doc).
    publish(msg): sends a control message to the sibling instances (ControlBus.publish)."""

    def __init__(self, abort: Callable[[str], None], publish: Callable[[dict], int]):
        self.registry = StopRegistry(abort)
        self._publish = publish

    def add(self, triton_id: str, engine_id: str) -> None:
        self.registry.add(triton_id, engine_id)

    def remove(self, engine_id: str) -> None:
        self.registry.remove(engine_id)

    def stop(self, triton_id: str) -> int:
        """Abort `triton_id` here and on every sibling instance; returns the local count."""
        n = self.registry.stop(triton_id)
        self._publish({"type": "stop", "id": triton_id})
        return n

    def on_control(self, msg: dict) -> None:
        """Control-bus handler of a sibling's forwarded stop."""
        self.registry.stop(str(msg.get("id", "")))
