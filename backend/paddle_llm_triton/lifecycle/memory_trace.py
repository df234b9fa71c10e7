"""Memory-growth diagnostics for a stub process (off unless asked for).

Set `PADDLE_LLM_MEMORY_TRACE_S` to an interval in seconds in the server's environment and every
model instance that calls `start_from_env()` logs, at that interval: its RSS, glibc's heap counters
(`mallinfo2`: bytes in use vs. bytes held free by the allocator, main arena and mmap'd chunks), and the
Python allocations that grew most since the first report (`tracemalloc`, by file and line).

Why both: RSS that grows while glibc's in-use bytes stay flat is allocator retention (free memory
the arenas keep), not a leak; in-use bytes that grow while Python's traced total stays flat is native
memory (Paddle, numpy buffers); Python growth names its line. tracemalloc costs CPU on every
allocation, so this is for a diagnostic run, never on by default.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import tracemalloc

log = logging.getLogger("memory_trace")

ENV = "PADDLE_LLM_MEMORY_TRACE_S"


class _MallInfo2(ctypes.Structure):
    # glibc >= 2.33 `struct mallinfo2` (malloc.h): every field a size_t, in bytes
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_counters() -> dict | None:
    """glibc's heap counters in MB: `in_use` (uordblks, allocated chunks of all arenas), `free_held`
    (fordblks, free chunks the arenas keep), `arena` (bytes obtained with sbrk/mmap for arenas),
    `mmapped` (hblkhd, chunks mmap'd on their own). None where mallinfo2 is missing (not glibc, or
    glibc < 2.33)."""
    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    m = fn()
    mb = 1.0 / (1 << 20)
    return {"in_use": round(m.uordblks * mb, 1), "free_held": round(m.fordblks * mb, 1),
            "arena": round(m.arena * mb, 1), "mmapped": round(m.hblkhd * mb, 1)}


def rss_mb() -> float:
    """Resident set size of this process in MB (/proc/self/statm; 0.0 where unreadable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        return 0.0


class MemoryTrace:
    """A daemon thread that logs one report every `interval_s` seconds until close().
    Raises ValueError for interval_s <= 0."""

    def __init__(self, label: str, interval_s: float, top: int = 8):
        if interval_s <= 0:
            raise ValueError(f"{ENV} must be a positive number of seconds, got {interval_s}")
        self.label, self.interval_s, self.top = label, interval_s, top
        self._stop = threading.Event()
        if not tracemalloc.is_tracing():
            tracemalloc.start(1)
        self._base = None
        self._thread = threading.Thread(target=self._run, name=f"memory-trace-{label}", daemon=True)
        self._thread.start()

    def report(self) -> str:
        """One report line (and the top Python growth since the first report) as text."""
        snap = tracemalloc.take_snapshot()
        traced, _ = tracemalloc.get_traced_memory()
        heap = heap_counters()
        head = (f"memory {self.label}: rss {rss_mb():.1f} MB, python traced {traced / (1 << 20):.1f} MB"
                + ("" if heap is None else ", glibc " + ", ".join(f"{k} {v} MB" for k, v in heap.items())))
        if self._base is None:
            self._base = snap
            return head + " (baseline)"
        diffs = [d for d in snap.compare_to(self._base, "lineno") if d.size_diff > 0][: self.top]
        lines = [f"  +{d.size_diff / 1024:.1f} KiB ({d.count_diff:+d} blocks) {d.traceback[0]}" for d in diffs]
        return "\n".join([head] + lines)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                log.warning("%s", self.report())
            except Exception as e:  # noqa: BLE001 - a diagnostic must never take the process down
                log.warning("memory %s: report failed: %s: %s", self.label, type(e).__name__, e)

    def close(self) -> None:
        """Stop the thread (within one interval)."""
        self._stop.set()


def start_from_env(label: str) -> MemoryTrace | None:
    """A MemoryTrace when PADDLE_LLM_MEMORY_TRACE_S is set, else None. Raises ValueError for a value
    that is not a positive number (a diagnostic asked for and silently not run would mislead)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        interval = float(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be a number of seconds, got {raw!r}") from None
    return MemoryTrace(label, interval)
