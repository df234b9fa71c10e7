"""The device's free memory from Enflame's TOPS runtime (TopsRider's libtopsrt.so), through ctypes.

paddle-custom-gcu gives Paddle no free-memory figure for a GCU; the runtime under it has one:
`topsError_t topsMemGetInfo(size_t* free, size_t* total)` (bytes, of the calling thread's current
device, set with `topsError_t topsSetDevice(int)`; `topsGetDevice(int*)` reads it; topsSuccess is
0), as in TopsRider's tops_runtime_api.h. The plug-in links the same library, so loading it here
shares the process's runtime instead of starting a second one.

Where the library is looked for, first found wins:
1. $PADDLE_LLM_TOPSRT_LIBRARY (the operator's setting: a full path to libtopsrt.so);
2. "libtopsrt.so" through the dynamic loader's search (LD_LIBRARY_PATH as set when the process
   started, the ldconfig cache: TopsRider installs register /opt/tops/lib);
3. /opt/tops/lib/libtopsrt.so (TopsRider's default install folder).
Nothing here raises: without the library, or when a call fails, mem_get_info returns None (query
says why), so the caller falls back to another figure.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

LIBRARY_ENV = "PADDLE_LLM_TOPSRT_LIBRARY"
LIBRARY_NAME = "libtopsrt.so"
DEFAULT_PATH = "/opt/tops/lib/libtopsrt.so"
TOPS_SUCCESS = 0

_lock = threading.Lock()


def _candidates() -> list[str]:
    setting = os.environ.get(LIBRARY_ENV, "").strip()
    return [setting] if setting else [LIBRARY_NAME, DEFAULT_PATH]


@functools.lru_cache(maxsize=8)
def _load(candidates: tuple[str, ...]) -> tuple[ctypes.CDLL | None, str]:
    """(the runtime library with its prototypes set, where it came from) or (None, why not)."""
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(str(e))
            continue
        try:
            lib.topsMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
            lib.topsMemGetInfo.restype = ctypes.c_int
            lib.topsSetDevice.argtypes = [ctypes.c_int]
            lib.topsSetDevice.restype = ctypes.c_int
        except AttributeError as e:  # loads, but is not the TOPS runtime
            errors.append(f"{path}: {e}")
            continue
        return lib, path
    return None, "; ".join(errors)


def runtime_library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded TOPS runtime or None, its path or why it did not load)."""
    return _load(tuple(_candidates()))


def _previous_device(lib: ctypes.CDLL) -> int | None:
    get = getattr(lib, "topsGetDevice", None)
    if get is None:
        return None
    dev = ctypes.c_int(-1)
    get.argtypes, get.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int
    return dev.value if get(ctypes.byref(dev)) == TOPS_SUCCESS and dev.value >= 0 else None


def query(device_index: int) -> tuple[tuple[int, int] | None, str]:
    """((free bytes, total bytes) of GCU `device_index`, where from) or (None, why not). The calling
    thread's current device is restored afterwards (when the runtime can tell it)."""
    lib, where = runtime_library()
    if lib is None:
        return None, f"the TOPS runtime did not load ({where})"
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    with _lock:
        prev = _previous_device(lib)
        rc = lib.topsSetDevice(int(device_index))
        if rc != TOPS_SUCCESS:
            return None, f"topsSetDevice({device_index}) in {where} returned error {rc}"
        rc = lib.topsMemGetInfo(ctypes.byref(free), ctypes.byref(total))
        if prev is not None and prev != device_index:
            lib.topsSetDevice(prev)
    if rc != TOPS_SUCCESS:
        return None, f"topsMemGetInfo in {where} returned error {rc}"
    if total.value == 0 or free.value > total.value:
        return None, f"topsMemGetInfo in {where} reported {free.value} bytes free of {total.value}"
    return (int(free.value), int(total.value)), f"topsMemGetInfo in {where}"


def mem_get_info(device_index: int) -> tuple[int, int] | None:
    """(free bytes, total bytes) of GCU `device_index` from the TOPS runtime, or None when the
    library does not load or the call fails (query() says why)."""
    return query(device_index)[0]
