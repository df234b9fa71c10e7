"""What the sections of benchmarks/bench_kernels.py share: SmolLM2-135M's shapes, the host's CPU model,
flags and L3 size, the timer (seconds per call, the minimum over repetitions), the row printer
(microseconds per call and GB/s) and the paged KV layout of the attention sections."""

from __future__ import annotations

import platform
import time

import numpy as np

# SmolLM2-135M
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 576, 9, 3, 64, 1536, 49152, 30
GEMVS = [("qkv", (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), ("o", HIDDEN, HEADS * HEAD_DIM),
         ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER), ("lm_head", VOCAB, HIDDEN)]


def cpu_model() -> tuple[str, list[str]]:
    name, flags = platform.processor() or "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("unknown", "x86_64", ""):
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    keep = [f for f in flags if f in ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "amx_tile")]
    return name, keep


def l3_bytes() -> int:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            s = f.read().strip()
        return int(s[:-1]) * (1024 if s.endswith("K") else 1024 * 1024 if s.endswith("M") else 1)
    except (OSError, ValueError):
        return 64 << 20


def timeit(fn, reps: int, repeats: int) -> float:
    """Minimum over `repeats` of the mean seconds per call over `reps` calls (after a warm-up)."""
    fn(0)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(reps):
            fn(i)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def row(name: str, cols: list[tuple[str, float, float | None]]) -> None:
    parts = [f"{name:<28}"]
    for label, sec, nbytes in cols:
        gbs = f" {nbytes / sec / 1e9:5.1f} GB/s" if nbytes else ""
        parts.append(f"{label} {sec * 1e6:9.1f} us{gbs}")
    print("  ".join(parts), flush=True)


def timed(fn) -> float:
    """Seconds of one call of fn()."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def paged_layout(rng, b: int, ctx: int, bs: int):
    """B contexts uniform in [ctx / 2, 3 ctx / 2], their blocks of `bs` slots shuffled over a pool:
    (lens, blocks in the pool, block tables [B, max blocks], dense slot ids [B, longest], additive
    mask [1, B, 1, longest] for the composed attention)."""
    lens = rng.integers(ctx // 2, 3 * ctx // 2 + 1, b)
    need = [-(-int(c) // bs) for c in lens]
    nblocks = sum(need) + 8
    ids = rng.permutation(nblocks)
    tables = np.zeros((b, max(need)), np.int32)
    width = int(lens.max())
    dslots = np.zeros((b, width), np.int64)
    mask = np.full((1, b, 1, width), -np.inf, np.float32)
    used = 0
    for i, (c, n) in enumerate(zip(lens, need)):
        tables[i, :n] = ids[used:used + n]
        used += n
        p = np.arange(c)
        dslots[i, :c] = tables[i, p // bs].astype(np.int64) * bs + p % bs
        mask[0, i, 0, :c] = 0
    return lens, nblocks, tables, dslots, mask
