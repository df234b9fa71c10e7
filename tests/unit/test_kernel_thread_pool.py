"""The C++ kernels' thread pool (csrc/thread_pool.cc): chunks taken from a shared counter, the caller
waiting for chunks rather than threads. What must hold whatever the scheduling: every output element
computed exactly once, by one chunk, so results equal the one-thread result bit for bit, for any
thread count, for the OpenMP form, for concurrent callers, after the workers fell asleep, and beside a
busy process that takes a core away (guarded against a hang with generous time-outs)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import numpy as np
import paddle
import pytest

import paddle_llm_ops.cpu_kernels as ck

# An odd output count: the last chunk is short, and chunk starts are not multiples of the tile sizes.
N, K = 3077, 576


@pytest.fixture(scope="module")
def lib():
    paddle.set_device("cpu")
    path = ck.load()
    lib = ctypes.CDLL(str(path))
    lib.plk_set_openmp_jobs.argtypes = [ctypes.c_int]
    yield lib
    lib.plk_set_openmp_jobs(0)
    ck.set_num_threads(0)


def _case(seed: int, b: int):
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal((b, K)).astype(np.float32))
    w = paddle.to_tensor(rng.standard_normal((N, K)).astype(np.float32))
    return x, w


def _one_thread(x, w, isa):
    ck.set_num_threads(1)
    try:
        return ck.gemv(x, w, isa=isa).numpy()
    finally:
        ck.set_num_threads(0)


@pytest.mark.parametrize("b", [1, 5])
def test_any_thread_count_and_the_openmp_form_give_the_one_thread_result(lib, b):
    x, w = _case(b, b)
    ref = _one_thread(x, w, "generic")
    assert np.isfinite(ref).all()
    for threads in (2, 3, 5):
        ck.set_num_threads(threads)
        try:
            assert np.array_equal(ck.gemv(x, w, isa="generic").numpy(), ref), threads
            lib.plk_set_openmp_jobs(1)
            assert np.array_equal(ck.gemv(x, w, isa="generic").numpy(), ref), f"openmp, {threads}"
        finally:
            lib.plk_set_openmp_jobs(0)
            ck.set_num_threads(0)


def test_workers_woken_from_sleep_compute_every_chunk(lib):
    x, w = _case(11, 2)
    ref = _one_thread(x, w, "generic")
    ck.set_num_threads(2)
    try:
        for _ in range(5):
            time.sleep(0.01)  # far past the workers' 50 us of polling: they sleep
            assert np.array_equal(ck.gemv(x, w, isa="generic").numpy(), ref)
    finally:
        ck.set_num_threads(0)


def test_concurrent_callers_each_get_their_own_result(lib):
    """Two Python threads calling kernels at once (e.g. an engine step and another op): one caller
    holds the pool, the other runs its job alone; neither sees the other's chunks."""
    cases = [_case(20 + i, 1 + i) for i in range(4)]
    refs = [_one_thread(x, w, "generic") for x, w in cases]
    ck.set_num_threads(2)
    failures: list[str] = []

    def caller(i):
        x, w = cases[i]
        for r in range(40):
            if not np.array_equal(ck.gemv(x, w, isa="generic").numpy(), refs[i]):
                failures.append(f"caller {i} round {r}")
                return

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a caller hung"
    finally:
        ck.set_num_threads(0)
    assert failures == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs for a competitor on one of them")
def test_results_and_progress_beside_a_busy_process(lib):
    """A busy loop at normal priority pinned to one of our CPUs takes a worker's core for whole time
    slices; the caller finishes the chunks the worker never took and waits only for one it holds."""
    x, w = _case(31, 1)
    isa = "avx2_fma" if "avx2_fma" in ck.supported_isas() else "generic"
    ref = _one_thread(x, w, isa)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    busy = subprocess.Popen([sys.executable, "-c",
                             f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"])
    ck.set_num_threads(2)
    done = threading.Event()
    bad: list[int] = []

    def calls():
        for i in range(200):
            if not np.array_equal(ck.gemv(x, w, isa=isa).numpy(), ref):
                bad.append(i)
        done.set()

    try:
        threading.Thread(target=calls, daemon=True).start()
        assert done.wait(timeout=300), "200 calls beside a busy process did not finish in 300 s"
    finally:
        busy.kill()
        busy.wait(timeout=10)
        ck.set_num_threads(0)
    assert bad == []
