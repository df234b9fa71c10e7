"""Measurement for benchmarks/compare.py: the host (CPU model, ISA flags), its read bandwidth
(bytes/s), the weight bytes a decode step reads, request records and their statistics
(client_examples/load_stats.summarize_records, the same for every system: seconds, tokens/s), and the
read-bandwidth limit each level is set against (tokens/s)."""

from __future__ import annotations

import math
import os
import platform
import threading
import time
from pathlib import Path

from comparison.common import OURS, bench_engine, load_stats


def host_info(threads: int) -> dict:
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model in ("unknown", platform.processor()):
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return {"cpu": model, "isa": isa, "cores": os.cpu_count(), "threads": threads,
            "kernel": platform.release(), "python": platform.python_version()}


def measure_bandwidth(threads: int, gib: float = 1.0, repeats: int = 5) -> dict:
    """Read bandwidth: float64 sum of a `gib` GiB array split into `threads` parts, one thread each
    (numpy releases the GIL in the reduction); best of `repeats`, bytes / seconds."""
    import numpy as np

    a = np.ones(int(gib * (1 << 30)) // 8, dtype=np.float64)  # ones: every page touched before timing
    parts = np.array_split(a, threads)
    best = math.inf
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)
        ths = [threading.Thread(target=lambda p=p: (barrier.wait(), p.sum())) for p in parts]
        for t in ths:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in ths:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return {"bytes_per_s": a.nbytes / best, "array_bytes": a.nbytes, "threads": threads, "repeats": repeats,
            "method": f"numpy float64 sum over {a.nbytes / (1 << 30):g} GiB in {threads} thread(s), best of {repeats}"}


def wint8_bytes_estimate(model_dir: Path, tied: bool) -> int:
    """Bytes per decode step if every 2-D weight were int8 with one fp32 scale per output row and the
    rest fp32 (weight-only int8 as planned: for the limit of a --quantization wint8 run)."""
    return sum(math.prod(s) + 4 * s[0] if len(s) == 2 else 4 * math.prod(s)
               for s in bench_engine().tensor_shapes(model_dir, tied).values())


def wint4_bytes_estimate(model_dir: Path, tied: bool, group: int = 64) -> int:
    """Bytes per decode step if every 2-D weight were int4 (two per byte) with one fp32 scale per
    `group` input channels (wint4's default group of 64) and the rest fp32."""
    return sum(math.prod(s) // 2 + 4 * s[0] * math.ceil(s[1] / group) if len(s) == 2 else 4 * math.prod(s)
               for s in bench_engine().tensor_shapes(model_dir, tied).values())


def make_record(index: int, sent: float, times: list[float], tokens: list[int], final: float | None,
                error: str | None = None, cut: bool = False):
    rec = load_stats().RequestRecord(index)
    rec.sent, rec.times, rec.tokens, rec.final, rec.error, rec.cut = sent, times, tokens, final, error, cut
    return rec


def summarize(records, t0: float, t_end: float) -> dict:
    return load_stats().summarize_records(records, t0, t_end, prompt_tokens=False)


def apply_limits(results: dict, weight_bytes: dict, bytes_per_s: float) -> dict:
    """Per-sequence limits (tokens/s = bandwidth / weight bytes per step, per weight format); sets each
    level's limit_tokens_per_s (streams x limit) and of_limit (decode tokens/s / that). Returns the
    per-sequence limits."""
    limit = {k: bytes_per_s / v for k, v in weight_bytes.items()}
    for s, r in results.items():
        if s.startswith("llamacpp-") and s[len("llamacpp-"):] in limit:
            key = s[len("llamacpp-"):]
        elif s in OURS and ("wint8" in limit or "wint4" in limit):
            key = "wint8" if "wint8" in limit else "wint4"
        else:
            key = "fp32"
        for c, lv in r["levels"].items():
            d = lv.get("decode_tokens_per_s")
            lv["limit_tokens_per_s"] = c * limit[key]
            lv["of_limit"] = d / (c * limit[key]) if d else None
    return limit
