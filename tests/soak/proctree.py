"""The processes of one soak server, read from /proc (Linux only, standard library only).

Everything starts from the pid of the launcher the soak spawned: tritonserver is a descendant of
it, the Python-backend stubs are descendants of tritonserver (named by the instance in their argv,
e.g. `llm_0_0`), and tensor-parallel workers are descendants of a stub. A process is identified by
(pid, start time), so a reused pid is never mistaken for one of ours and nothing outside the tree
is ever touched.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

STUB_NAME = "triton_python_backend_stub"
TP_WORKER_MODULE = "paddle_llm_engine.executor.tp_worker"
_STUB_INSTANCE_ARG = 8  # stub argv: stub model.py region shm_size shm_grow ppid backend_dir timeout INSTANCE ...


@dataclasses.dataclass(frozen=True)
class Proc:
    """One live process of the server tree. role: launcher | tritonserver | stub | tp_worker | other;
    name: a stable label for reports ("stub:llm_0_0", "tp_worker:llm_tp2_0_0:1")."""

    pid: int
    start: int  # start time in clock ticks since boot (/proc/PID/stat field 22)
    ppid: int
    role: str
    name: str

    @property
    def key(self) -> str:
        """Label plus pid: one RSS series per process lifetime."""
        return f"{self.name}#{self.pid}"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start ticks) or None when the process is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def alive(pid: int, start: int | None = None) -> bool:
    """True while pid runs (not a zombie) and, when given, still has that start time."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X") and (start is None or st[2] == start)


def cmdline(pid: int) -> list[str]:
    """argv of a process ([] when it is gone)."""
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def rss_bytes(pid: int) -> int | None:
    """Resident set size (VmRSS) in bytes, None when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[0] not in ("Z", "X"):
                out.setdefault(st[1], []).append(int(entry))
    return out


def tree(root_pid: int) -> list[Proc]:
    """root_pid and all its live descendants, labelled (empty when root is gone)."""
    st = _stat(root_pid)
    if st is None or st[0] in ("Z", "X"):
        return []
    kids = _children_map()
    out: list[Proc] = []
    todo = [(root_pid, None)]
    while todo:
        pid, parent_stub = todo.pop()
        s = _stat(pid)
        if s is None:
            continue
        argv = cmdline(pid)
        exe = argv[0] if argv else ""
        if pid == root_pid:
            role, name = "launcher", "launcher"
        elif exe.endswith("/tritonserver") or exe == "tritonserver":
            role, name = "tritonserver", "tritonserver"
        elif exe.endswith(STUB_NAME):
            inst = argv[_STUB_INSTANCE_ARG] if len(argv) > _STUB_INSTANCE_ARG else f"pid{pid}"
            role, name = "stub", f"stub:{inst}"
        elif TP_WORKER_MODULE in argv and parent_stub is not None:
            role, name = "tp_worker", f"tp_worker:{parent_stub}"
        elif "paddle_llm_openai" in argv:
            role, name = "openai", "openai_frontend"
        else:
            role, name = "other", f"other:{Path(exe).name or pid}"
        out.append(Proc(pid, s[2], s[1], role, name))
        stub_here = name[5:] if role == "stub" else parent_stub
        todo.extend((c, stub_here) for c in kids.get(pid, []))
    # number the workers of each stub in pid order (rank 0 is started first)
    workers: dict[str, list[Proc]] = {}
    for p in out:
        if p.role == "tp_worker":
            workers.setdefault(p.name, []).append(p)
    for name, ps in workers.items():
        for i, p in enumerate(sorted(ps, key=lambda q: q.pid)):
            out[out.index(p)] = dataclasses.replace(p, name=f"{name}:{i}")
    return sorted(out, key=lambda p: p.pid)


def find(procs: list[Proc], role: str, name_part: str = "") -> list[Proc]:
    """The processes of `procs` with that role whose label contains name_part."""
    return [p for p in procs if p.role == role and name_part in p.name]


def shm_regions(pid: int) -> set[str]:
    """/dev/shm/triton_python_backend_shm_region_* files a process maps (to remove after a kill)."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find("/dev/shm/triton_python_backend_shm_region_")
                if i >= 0:
                    found.add(line[i:].strip().replace(" (deleted)", ""))
    except OSError:
        pass
    return found


def kill(p: Proc, sig: int = signal.SIGKILL) -> bool:
    """Send sig to p if it is still that process (pid and start time). True if sent."""
    if not alive(p.pid, p.start):
        return False
    try:
        os.kill(p.pid, sig)
        return True
    except ProcessLookupError:
        return False


def kill_tree(procs: list[Proc], timeout: float = 10.0) -> list[Proc]:
    """SIGKILL every process of `procs` (deepest first), remove the shm regions they mapped, wait
    up to timeout seconds; returns those still alive."""
    regions: set[str] = set()
    for p in procs:
        regions |= shm_regions(p.pid)
    for p in sorted(procs, key=lambda q: {"tp_worker": 0, "stub": 1, "other": 1, "tritonserver": 2}.get(q.role, 3)):
        kill(p)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p.pid, p.start) for p in procs):
        time.sleep(0.05)
    for path in regions:
        try:
            os.unlink(path)
        except OSError:
            pass
    return [p for p in procs if alive(p.pid, p.start)]
