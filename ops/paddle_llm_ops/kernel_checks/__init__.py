"""Numerical checks of the optional kernels against the composed Paddle ops, run at engine start.

A kernel being registered for a place proves nothing (paddle-custom-gcu registers stubs that
allocate their output and compute nothing), so the platform layer turns an optional kernel on only
after its check passed on that place. A check is a function `fn(dtype, **params) -> (max |kernel -
composed|, max |composed|)` (optionally a third element naming the worst part) that runs the kernel
and the composed ops on the same small seeded random inputs on the current device, with shapes that
exercise the real cases (GQA, several sequences, a ragged decode batch, block boundaries). It
raises for a kernel that cannot run. Judging (per-dtype tolerance), child processes and the verdict
cache are the platform layer's (paddle_llm_engine.platforms.kernel_checks).

Registered here: CHECKS (kernel name -> check), ISOLATED (checks whose kernel can kill the process:
run in a child process), BUILD_IDS (kernel name -> function naming the build of the kernel's
library, part of the cache key of a CPU verdict). Modules with checks: kernel_checks.cpu (the C++
CPU kernels, Paddle's fused_rms_norm), kernel_checks.gcu (the paddle-custom-gcu kernels).
"""

from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

CHECKS: dict[str, Callable[..., tuple]] = {}
ISOLATED: set[str] = set()
BUILD_IDS: dict[str, Callable[[], str]] = {}
# The modules that register checks, imported on first use (load_checks).
CHECK_MODULES = ("paddle_llm_ops.kernel_checks.cpu", "paddle_llm_ops.kernel_checks.gcu")


def register(name: str, *, isolate: bool = False, build_id: Callable[[], str] | None = None):
    """Decorator: register `fn(dtype, **params)` as the check of optional kernel `name`.
    isolate: the kernel can kill the process (SIGILL, abort): the check runs in a child process;
    build_id: names the build of the kernel's library (a rebuilt library is checked again).
    Raises ValueError when another function is already registered under `name`."""
    def deco(fn):
        if CHECKS.get(name, fn) is not fn:
            raise ValueError(f"a kernel check named {name!r} is already registered ({CHECKS[name].__qualname__})")
        CHECKS[name] = fn
        if isolate:
            ISOLATED.add(name)
        if build_id is not None:
            BUILD_IDS[name] = build_id
        return fn
    return deco


def load_checks() -> dict[str, Callable[..., tuple]]:
    """Import the modules of CHECK_MODULES that exist (registering their checks); returns CHECKS.
    A module that is absent is skipped; one that fails to import raises (the caller reports it)."""
    for module in CHECK_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
    return CHECKS


# ------------------------------------------------------------------------------- helpers for checks
def random_array(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    """Standard normal fp32 numbers times `scale`, of `shape`."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def to_numpy(t) -> np.ndarray:
    """A paddle tensor (any float dtype, any place) or array as float64 numpy."""
    if hasattr(t, "numpy"):
        if str(t.dtype) in ("paddle.bfloat16", "paddle.float16"):
            t = t.astype("float32")
        t = t.numpy()
    return np.asarray(t, dtype=np.float64)


def difference(kernel, composed) -> tuple[float, float]:
    """(max |kernel - composed|, max |composed|) of two same-shape outputs; a kernel output with a
    NaN or an infinity where the composed one is finite counts as an infinite difference. Raises
    ValueError when the shapes differ (a kernel returning the wrong shape is wrong)."""
    k, r = to_numpy(kernel), to_numpy(composed)
    if k.shape != r.shape:
        raise ValueError(f"the kernel's output has shape {list(k.shape)}, the composed ops' {list(r.shape)}")
    if k.size == 0:
        return 0.0, 0.0
    d = np.abs(k - r)
    bad = ~np.isfinite(k) & np.isfinite(r)
    diff = float("inf") if bad.any() else float(np.nanmax(d))
    return diff, float(np.abs(r).max())


def worst(parts: dict[str, tuple[float, float]]) -> tuple[float, float, str]:
    """The part whose difference is largest relative to max(1, max |composed|) (the measure the
    tolerance is applied to), as (difference, max |composed|, part name): one check can cover
    several ops of different scales and passes only when each of them does."""
    name = max(parts, key=lambda n: parts[n][0] / max(1.0, parts[n][1]) if parts[n][0] == parts[n][0]
               else float("inf"))
    return parts[name][0], parts[name][1], name
