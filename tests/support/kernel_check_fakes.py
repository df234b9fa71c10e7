"""Fake kernel checks for tests/unit/test_kernel_checks.py, importable by name from a child
process (platforms.kernel_checks.run_in_child imports a check by module and function name): a
kernel that kills its process, one that raises, one that agrees and one that returns garbage."""

from __future__ import annotations

import os
import signal

import numpy as np

from paddle_llm_ops.kernel_checks import difference


def dies_with_sigill(dtype: str, **params) -> tuple[float, float]:
    """As Paddle 3.3's CPU fused_rms_norm on an AVX2-only host: the process gets SIGILL."""
    os.kill(os.getpid(), signal.SIGILL)
    return 0.0, 0.0


def aborts(dtype: str, **params) -> tuple[float, float]:
    """A kernel library that calls abort() (glibc assertion, PD_CHECK in a non-Python thread)."""
    os.abort()


def raises(dtype: str, **params) -> tuple[float, float]:
    raise RuntimeError("kernel 'rms_norm_gcu' is not registered for gcu")


def _rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w


def agrees(dtype: str, scale: float = 1.0, **params) -> tuple[float, float]:
    """A correct kernel: the same RMSNorm summed in another order (float32 rounding apart)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 64)).astype(np.float32) * np.float32(scale)
    w = rng.standard_normal(64).astype(np.float32)
    ms = np.float32(0)
    for v in (x * x)[:, ::-1].T:  # column by column, reversed: another summation order
        ms = ms + v
    kernel = x / np.sqrt(ms[:, None] / np.float32(64) + np.float32(1e-6)) * w
    return difference(kernel, _rms(x, w))


def garbage(dtype: str, **params) -> tuple[float, float]:
    """A stub kernel: allocates its output and computes nothing (uninitialised memory)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    stub_output = np.empty_like(x)
    stub_output[...] = np.float32(3.1e7)  # whatever the allocator left there
    return difference(stub_output, _rms(x, w))


def nan_output(dtype: str, **params) -> tuple[float, float]:
    """A kernel that writes NaN into one element."""
    ref = np.ones((2, 3), np.float32)
    out = ref.copy()
    out[1, 2] = np.nan
    return difference(out, ref)
