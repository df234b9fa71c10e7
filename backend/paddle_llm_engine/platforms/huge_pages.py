"""Transparent huge pages (2 MiB) under a CPU worker's weights and KV cache.

Why: a decode step streams every weight once. On 4 KiB pages that is a TLB miss per 4 KiB read (in
a virtual machine each miss walks two page tables), and the hardware prefetchers stop at every page
boundary. Measured on a 2-core AMD EPYC VM: one thread's fp32 GEMV over a cold 28 MB weight read
20.5 GB/s on 4 KiB pages and 32.0 GB/s on 2 MiB pages (a standalone copy of the kernel's loop);
llama.cpp's mmap'd GGUF is read through the page cache, which may use large folios.

How: every 2 MiB-aligned region that a tensor's bytes touch is advised MADV_HUGEPAGE (so that the
kernel keeps it on huge pages) and then MADV_COLLAPSE (Linux 6.1+: the pages already written move
onto huge pages now, synchronously). Regions are rounded outward: the bytes around a tensor in the
same region are this process's own heap, and only their page size changes. Where MADV_COLLAPSE is
missing, khugepaged collapses the advised regions over time; where transparent huge pages are
"never", or madvise fails, nothing changes. Either way the outcome is reported, never raised: huge
pages change speed, not results.
"""

from __future__ import annotations

import ctypes
import errno
import types
from dataclasses import dataclass
from typing import Callable, Iterable

HUGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_ENABLED) -> str:
    """The bracketed choice of /sys/kernel/mm/transparent_hugepage/enabled ("always", "madvise",
    "never"), or "unknown" when the file is missing or unreadable (no THP support)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "unknown"


def anonymous_mappings(path: str = "/proc/self/maps") -> list[tuple[int, int]]:
    """(start, end) of this process's private anonymous read-write mappings (the heap and mmap'd
    allocations: no file, no [stack] / [vdso] ...), from /proc/self/maps; [] when unreadable."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 5 or not parts[1].startswith("rw") or parts[1][3] != "p" or parts[4] != "0":
                    continue
                name = parts[5] if len(parts) > 5 else ""
                if name not in ("", "[heap]"):
                    continue
                a, b = parts[0].split("-")
                out.append((int(a, 16), int(b, 16)))
    except OSError:
        return []
    return out


def huge_regions(ranges: Iterable[tuple[int, int]], mappings: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, length) runs of whole 2 MiB-aligned regions that hold bytes of the (address, nbytes)
    ranges and lie inside one of the `mappings` ((start, end): madvise refuses a range with a hole,
    and MADV_COLLAPSE one that crosses into another mapping). Regions are rounded outward within the
    mapping, sorted, adjacent ones merged; empty ranges are skipped."""
    regions = set()
    for a, n in ranges:
        if n <= 0:
            continue
        for ms, me in mappings:
            lo, hi = max(a, ms), min(a + n, me)
            if lo >= hi:
                continue
            first, last = max(lo // HUGE, -(-ms // HUGE)), min(-(-hi // HUGE), me // HUGE)
            regions.update(range(first, last))
    runs: list[list[int]] = []
    for r in sorted(regions):
        if runs and r == runs[-1][1]:
            runs[-1][1] = r + 1
        else:
            runs.append([r, r + 1])
    return [(s * HUGE, (e - s) * HUGE) for s, e in runs]


def _libc_madvise() -> Callable[[int, int, int], int]:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int

    def madvise(addr: int, length: int, advice: int) -> int:
        """0, or the errno of a failed madvise(2)."""
        return 0 if fn(addr, length, advice) == 0 else ctypes.get_errno()

    return madvise


@dataclass
class HugePageReport:
    """What advise_huge_pages did: bytes of the tensors, bytes of the 2 MiB regions advised, of them
    collapsed now, and one line for the log (`outcome`)."""

    tensor_bytes: int = 0
    advised_bytes: int = 0
    collapsed_bytes: int = 0
    outcome: str = ""


def advise_huge_pages(ranges: list[tuple[int, int]], madvise: Callable[[int, int, int], int] | None = None,
                      mode: str | None = None, mappings: list[tuple[int, int]] | None = None,
                      collapse: bool = True) -> HugePageReport:
    """Put the 2 MiB regions under these (address, nbytes) ranges on transparent huge pages (see the
    module docstring). madvise(addr, length, advice) -> 0 or an errno (default: libc's); mode: the
    THP mode (default: thp_mode()); mappings: the anonymous mappings (default: anonymous_mappings());
    collapse: also MADV_COLLAPSE now (it copies every written 4 KiB page: about 2.8 s per GiB here).
    Never raises for an OS refusal: the report says what happened."""
    rep = HugePageReport(tensor_bytes=sum(n for _, n in ranges if n > 0))
    mode = thp_mode() if mode is None else mode
    if mode in ("never", "unknown"):
        rep.outcome = f"4 KiB pages: transparent huge pages are {mode!r} on this host ({THP_ENABLED})"
        return rep
    madvise = madvise or _libc_madvise()
    refused, collapse_err = set(), set()
    for start, length in huge_regions(ranges, anonymous_mappings() if mappings is None else mappings):
        err = madvise(start, length, MADV_HUGEPAGE)
        if err:
            refused.add(errno.errorcode.get(err, str(err)))
            continue
        rep.advised_bytes += length
        if not collapse:
            continue
        err = madvise(start, length, MADV_COLLAPSE)
        if err:
            collapse_err.add(errno.errorcode.get(err, str(err)))
        else:
            rep.collapsed_bytes += length
    mib = 1 << 20
    parts = [f"{rep.tensor_bytes / mib:.0f} MiB of tensors: {rep.advised_bytes / mib:.0f} MiB advised MADV_HUGEPAGE "
             f"(THP mode {mode!r}), " + (f"{rep.collapsed_bytes / mib:.0f} MiB collapsed onto huge pages now"
                                         if collapse else "left to khugepaged to collapse over time")]
    if refused:
        parts.append(f"MADV_HUGEPAGE refused ({', '.join(sorted(refused))}): those regions stay on 4 KiB pages")
    if collapse_err and rep.collapsed_bytes == 0 and collapse_err <= {"EINVAL"}:
        parts.append("MADV_COLLAPSE unsupported (Linux < 6.1?): khugepaged collapses the advised regions over time")
    elif collapse_err:
        parts.append(f"MADV_COLLAPSE failed for some regions ({', '.join(sorted(collapse_err))}): khugepaged may "
                     "collapse them later")
    rep.outcome = "; ".join(parts)
    return rep


# objects whose attributes are not a model's state
_NOT_CONTAINERS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def tensor_ranges(root, is_tensor: Callable[[object], bool], span: Callable[[object], tuple[int, int]],
                  max_depth: int = 8) -> list[tuple[int, int]]:
    """(address, nbytes) of every distinct tensor reachable from `root` through object attributes,
    lists, tuples and dict values (up to max_depth levels), as span(tensor) gives them; is_tensor
    tells tensors apart. Each object is visited once."""
    seen: set[int] = set()
    out: dict[int, int] = {}

    def visit(obj, depth: int) -> None:
        if id(obj) in seen or depth > max_depth:
            return
        seen.add(id(obj))
        if is_tensor(obj):
            addr, n = span(obj)
            if addr and n > 0:
                out[addr] = max(n, out.get(addr, 0))
            return
        if isinstance(obj, (list, tuple)):
            for x in obj:
                visit(x, depth + 1)
        elif isinstance(obj, dict):
            for x in obj.values():
                visit(x, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, _NOT_CONTAINERS):
            for x in vars(obj).values():
                visit(x, depth + 1)

    visit(root, 0)
    return sorted(out.items())


def paddle_cpu_ranges(root) -> list[tuple[int, int]]:
    """tensor_ranges for the paddle CPU tensors reachable from `root` (a model, a list of caches)."""
    import paddle

    def is_tensor(x) -> bool:
        return isinstance(x, paddle.Tensor) and x.place.is_cpu_place()

    def span(t) -> tuple[int, int]:
        if not t._is_initialized() or t.size == 0:
            return 0, 0
        return t.data_ptr(), int(t.size) * t.element_size()

    return tensor_ranges(root, is_tensor, span)
