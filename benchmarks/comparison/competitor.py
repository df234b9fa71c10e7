"""A competing process for the benchmarks that measure how the engine shares the CPU: a Python busy
loop at normal priority pinned to one CPU, alive for the duration of a `with` block (started and
ended by the benchmark, by its own PID)."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def last_cpu() -> int:
    """The highest-numbered CPU of this process's affinity mask (the competitor's CPU)."""
    return sorted(os.sched_getaffinity(0))[-1]


class Competitor:
    """`with Competitor(cpu):` runs `while True: pass` pinned to `cpu` for the block."""

    def __init__(self, cpu: int):
        self.cpu = cpu
        self.proc = None

    def __enter__(self):
        code = f"import os\nos.sched_setaffinity(0, {{{self.cpu}}})\nwhile True:\n    pass\n"
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait(timeout=10)
