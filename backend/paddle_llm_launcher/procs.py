"""What the launcher reads from /proc and /dev/shm to stop a tritonserver and its stubs cleanly
(Linux only; standard library only).

A Python-backend stub is a child process of tritonserver started as `stub model.py <region> ...`;
`<region>` names its shared-memory file /dev/shm/triton_python_backend_shm_region_*. Processes are
told apart by (pid, start time), so a reused pid is never mistaken for a stub.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
STUB_NAME = "triton_python_backend_stub"


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, None if it is gone or a zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def children(ppid: int) -> dict[int, int]:
    """{pid: start time} of the direct children of ppid."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st and st[0] == ppid:
                out[int(entry)] = st[1]
    return out


def mapped_regions(pid: int) -> set[str]:
    """Triton Python-backend shm region files mapped by a process."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find(str(SHM_DIR / SHM_PREFIX))
                if i >= 0:
                    found.add(line[i:].strip().replace(" (deleted)", ""))
    except OSError:
        pass
    return found


def stub_region(pid: int) -> str | None:
    """The shm region a stub was started with: its argv is `stub model.py <region name> ...`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if len(argv) > 2 and argv[0].endswith(STUB_NAME.encode()) and argv[2].startswith(SHM_PREFIX.encode()):
        return str(SHM_DIR / argv[2].decode())
    return None


def kill_if_same(processes) -> int:
    """SIGKILL each (pid, start time) that is still that process; returns how many were signalled."""
    n = 0
    for pid, start in processes:
        st = proc_stat(pid)
        if st is None or st[1] != start:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except ProcessLookupError:
            pass
    return n


def set_parent_death_signal() -> None:
    """In the child before exec: own process group, and SIGTERM if the launcher dies (Linux only)."""
    os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass
