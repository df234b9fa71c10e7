"""The C++ kernels' thread count for each decode-stack call, chosen from the call times measured.

Why: the kernels run on all their threads in lock-step, with a barrier after every matrix. On an idle
2-core host two threads make a decode-stack call 1.15-1.2x faster than one. But any other work on
those cores (a response's IPC inside tritonserver, the client, another engine, a noisy neighbour)
stalls both threads at the next barrier, not only the one it preempts: beside a busy process in
another session two threads made batch-1 calls 1.5x slower than one, and beside another engine with
`sched_autogroup` off 4-6x slower. Neither count is right on every host or at every moment, so the
engine measures both while it serves and keeps the faster.

How: the calls are grouped by batch size (buckets 1, 2, 3-4, 5-8, ... : step time grows with the
batch). Per bucket, each candidate count (1 and the configured count) gets an exponentially weighted
moving average of its call time. A call runs on the bucket's best candidate, except that every
`probe_interval` calls one call probes the other. Fewer threads win ties (averages within `margin`):
they leave a core to the rest of the process; more threads must be faster by the margin. The best
changes when a probe's average wins, or at once when the best's own average falls behind the
other's last one (load arrived). A probe that loses doubles the bucket's probe interval, up to
`max_probe_interval`, so a count that stays much slower costs one call in that many; a probe whose
own time would have won (load left) brings the next probe forward to `probe_interval` calls.
The thread count never changes a result: the kernels' summation order does not depend on it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


def batch_bucket(batch: int) -> int:
    """The bucket of a batch of `batch` rows: the next power of two >= batch (1, 2, 4, 8, ...).
    Raises ValueError for batch < 1."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return 1 << (batch - 1).bit_length()


@dataclass
class _Bucket:
    ewma: dict = field(default_factory=dict)  # threads -> seconds per call
    best: int = 0
    calls: int = 0
    interval: int = 0


class KernelThreadTuner:
    """Picks, per decode-stack call, 1 or `threads` kernel threads (see the module docstring).

    threads: the configured count (>= 2; with 1 there is nothing to choose). probe_interval /
    max_probe_interval: calls of a bucket between probes of the other count, at first and at most.
    margin: relative difference under which two averages count as a tie (0.05 = 5%). alpha: weight
    of a new call time in its average (0 < alpha <= 1).

    Use: t = tuner.pick(batch); run the call on t threads; tuner.record(batch, t, seconds).
    Thread-safe (one lock). Raises ValueError for out-of-range settings."""

    def __init__(self, threads: int, probe_interval: int = 16, max_probe_interval: int = 256,
                 margin: float = 0.05, alpha: float = 0.25):
        if threads < 2:
            raise ValueError(f"threads must be >= 2 to choose between 1 and threads, got {threads}")
        if not 1 <= probe_interval <= max_probe_interval:
            raise ValueError(f"need 1 <= probe_interval ({probe_interval}) <= max_probe_interval ({max_probe_interval})")
        if not 0 <= margin < 1 or not 0 < alpha <= 1:
            raise ValueError(f"need 0 <= margin < 1 and 0 < alpha <= 1, got margin {margin}, alpha {alpha}")
        self.threads = threads
        self.candidates = (1, threads)
        self.probe_interval = probe_interval
        self.max_probe_interval = max_probe_interval
        self.margin = margin
        self.alpha = alpha
        self._buckets: dict[int, _Bucket] = {}
        self._lock = threading.Lock()

    def _bucket(self, batch: int) -> _Bucket:
        key = batch_bucket(batch)
        b = self._buckets.get(key)
        if b is None:
            # start on the configured count: what ran before this tuner existed
            b = self._buckets[key] = _Bucket(best=self.threads, interval=self.probe_interval)
        return b

    def _other(self, threads: int) -> int:
        return self.candidates[0] if threads == self.candidates[1] else self.candidates[1]

    def pick(self, batch: int) -> int:
        """Threads for the next call of a batch of `batch` rows: the bucket's best, or the other
        count when it is unmeasured or its probe is due."""
        with self._lock:
            b = self._bucket(batch)
            b.calls += 1
            other = self._other(b.best)
            if other not in b.ewma and b.best in b.ewma:
                return other  # each count is measured once before any comparison
            if b.calls % b.interval == 0:
                return other
            return b.best

    def _wins(self, cand: int, cand_s: float, best: int, best_s: float) -> bool:
        """Whether `cand` threads at cand_s seconds beat `best` threads at best_s: fewer threads win
        ties (within the margin), more threads must be faster by the margin."""
        if cand < best:
            return cand_s <= best_s * (1 + self.margin)
        return cand_s < best_s * (1 - self.margin)

    def record(self, batch: int, threads: int, seconds: float) -> None:
        """A call of `batch` rows took `seconds` on `threads` threads (a count pick() returned)."""
        if threads not in self.candidates or not seconds >= 0:
            return
        with self._lock:
            b = self._bucket(batch)
            old = b.ewma.get(threads)
            # a probe's figure weighs more: the other count's average is older than the best's
            a = self.alpha if threads == b.best else max(self.alpha, 0.5)
            b.ewma[threads] = seconds if old is None else old + a * (seconds - old)
            other = self._other(b.best)
            best_s, other_s = b.ewma.get(b.best), b.ewma.get(other)
            if best_s is None or other_s is None:
                return
            if threads == b.best:
                # the best got slower (load arrived): switch now on the other's last average; if
                # that is stale, the other's own calls correct it the same way
                if self._wins(other, other_s, b.best, best_s):
                    b.best, b.interval = other, self.probe_interval
                return
            if self._wins(threads, other_s, b.best, best_s):
                b.best, b.interval = threads, self.probe_interval
            elif self._wins(threads, seconds, b.best, best_s):
                b.interval = self.probe_interval  # this call alone would win (load left?): probe again soon
            else:
                b.interval = min(2 * b.interval, self.max_probe_interval)

    def snapshot(self) -> dict[int, dict]:
        """Per bucket: {"best": threads, "ms": {threads: average ms per call}, "calls": n, "probe_interval": n}."""
        with self._lock:
            return {k: {"best": b.best, "ms": {t: 1e3 * s for t, s in sorted(b.ewma.items())}, "calls": b.calls,
                        "probe_interval": b.interval} for k, b in sorted(self._buckets.items())}
