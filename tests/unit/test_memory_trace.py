"""The memory-growth diagnostics: glibc's counters against an allocation of known size, the Python
growth named by its line, and a bad interval refused rather than ignored."""

from __future__ import annotations

import ctypes

import pytest

from paddle_llm_triton.lifecycle import memory_trace as M


def test_glibc_in_use_bytes_follow_a_native_allocation_of_known_size():
    before = M.heap_counters()
    libc = ctypes.CDLL(None)
    # no figure exactly where the C library has no mallinfo2 (musl, glibc < 2.33): never a made-up one
    assert (before is None) == (not hasattr(libc, "mallinfo2"))
    if before is None:
        return
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 chunks of 64 KiB: below the mmap threshold, so they land in an arena's in-use bytes
    ptrs = [libc.malloc(64 * 1024) for _ in range(64)]
    try:
        grown = M.heap_counters()["in_use"] - before["in_use"]
        assert 3.9 <= grown <= 4.5, grown  # 4 MiB asked for, plus chunk headers
    finally:
        for p in ptrs:
            libc.free(p)


def test_report_names_the_line_that_grew():
    t = M.MemoryTrace("unit", interval_s=3600)
    try:
        assert t.report().endswith("(baseline)")
        kept = [bytearray(4096) for _ in range(512)]  # 2 MiB from the next line number below
        text = t.report()
        first_growth = text.splitlines()[1]
        assert "test_memory_trace.py" in first_growth and float(first_growth.split("KiB")[0].strip(" +")) >= 2048
        assert len(kept) == 512
    finally:
        t.close()


def test_a_bad_interval_is_refused(monkeypatch):
    monkeypatch.setenv(M.ENV, "soon")
    with pytest.raises(ValueError, match=M.ENV):
        M.start_from_env("x")
    monkeypatch.setenv(M.ENV, "0")
    with pytest.raises(ValueError, match="positive"):
        M.start_from_env("x")
    monkeypatch.delenv(M.ENV)
    assert M.start_from_env("x") is None
