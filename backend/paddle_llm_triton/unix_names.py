"""Abstract Unix socket names this project binds, read back from the kernel's socket table.

Every process of a server (llm instances, the ensemble, the launcher) names its sockets
"\\0<kind>/<tritonserver pid>/<model>/<instance>" in the abstract namespace (Linux): nothing on disk,
gone with the process. /proc/net/unix lists each bound socket with its name ("@..."), its type and
flags (a listening stream socket carries __SO_ACCEPTCON), so a process finds its peers without any
registry: a peer that dies disappears from the table, a restarted one appears.
"""

from __future__ import annotations

_ACCEPTCON = 0x10000  # __SO_ACCEPTCON in the Flags column


def bound_names(prefix: str, listening: bool = False, proc_net_unix: str = "/proc/net/unix") -> list[str]:
    """The rest of every bound abstract name that starts with `prefix` (without the leading NUL),
    sorted and unique; `listening`: only listening stream sockets. Reads the table once (~100 us)."""
    want = "@" + prefix
    found = set()
    try:
        with open(proc_net_unix, encoding="utf-8", errors="replace") as f:
            next(f, None)  # header
            for line in f:
                parts = line.split()
                if len(parts) < 8 or not parts[7].startswith(want):
                    continue
                if listening:
                    try:
                        if not int(parts[3], 16) & _ACCEPTCON:
                            continue
                    except ValueError:
                        continue
                found.add(parts[7][len(want):])
    except OSError:
        return []
    return sorted(found)
