"""Benchmark-only entry points of the C++ CPU kernel library (paddle_llm_ops.cpu_kernels): a read
bandwidth probe, a fork/join timer of the kernels' thread pool, the threading policy switch and the
switch back to OpenMP regions (the A/B of benchmarks/bench_threads.py). They live here, not in
the product module, because only benchmarks/bench_kernels.py calls them."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

import paddle_llm_ops.cpu_kernels as ck

_POLICIES = {"auto": 0, "always": 1, "never": 2}


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    """The kernel library (loaded and registered by cpu_kernels.load) with the probes' signatures."""
    lib = ctypes.CDLL(str(ck.load()))
    lib.plk_read_probe.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    lib.plk_read_probe.restype = ctypes.c_int
    lib.plk_set_threading_policy.argtypes = [ctypes.c_int]
    lib.plk_set_openmp_jobs.argtypes = [ctypes.c_int]
    lib.plk_fork_join_probe.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.plk_fork_join_probe.restype = ctypes.c_double
    return lib


def set_threading_policy(policy: str) -> None:
    """"auto" (default; threads only above each op's work threshold), "always" (every op opens a
    parallel region of get_num_threads() threads), "never" (one thread)."""
    _lib().plk_set_threading_policy(_POLICIES[policy])


def set_openmp_jobs(on: bool) -> None:
    """True: the kernels' parallel ops run as OpenMP regions (one contiguous range per thread and a
    join barrier: the form before the pool); False (default): on the pool."""
    _lib().plk_set_openmp_jobs(int(bool(on)))


def fork_join_probe(iters: int, threads: int, idle_us: int = 0) -> float:
    """Mean microseconds of an empty job of `threads` chunks on the kernels' thread pool, each job
    after `idle_us` of serial work on the calling thread (long idles: the workers' wake-up)."""
    return float(_lib().plk_fork_join_probe(int(iters), int(threads), int(idle_us)))


def read_bandwidth_probe(buf: np.ndarray, threads: int, avx2: bool = True) -> int:
    """Read every float of the contiguous fp32 array `buf` once with `threads` threads (timed by
    the caller to measure the host's read bandwidth). Returns a checksum."""
    assert buf.dtype == np.float32 and buf.flags.c_contiguous
    return _lib().plk_read_probe(buf.ctypes.data, buf.size, int(threads), int(bool(avx2)))
