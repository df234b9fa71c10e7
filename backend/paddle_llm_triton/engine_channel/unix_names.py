"""Abstract Unix socket names this project binds, read back from the kernel's socket table.

Every process of a server (llm instances, the ensemble, the launcher) names its sockets
"\\0<kind>/<tritonserver pid>/<model>/<instance>" in the abstract namespace (Linux): nothing on disk,
gone with the process. /proc/net/unix lists each bound socket with its name ("@..."), its type and
flags (a listening stream socket carries __SO_ACCEPTCON), so a process finds its peers without any
registry: a peer that dies disappears from the table, a restarted one appears. Abstract names have
no file permissions, so every receiver of ours takes datagrams from its own user only
(recv_same_user).
"""

from __future__ import annotations

import os

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


def accept_credentials(sock) -> None:
    """Ask the kernel to attach the sender's credentials to every datagram `sock` receives
    (SO_PASSCRED): recv_same_user() needs it. Call before the first receive."""
    import socket

    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def recv_same_user(sock, bufsize: int) -> tuple[bytes, str | bytes | None] | None:
    """One datagram of an abstract-namespace socket, or None when its sender runs as another user
    (root excepted). Abstract names have no file permissions: any process of the host's network
    namespace may send to them, so the sender's uid, which the kernel attaches (SCM_CREDENTIALS,
    after accept_credentials()), decides. Returns (data, sender address). Raises OSError as recv."""
    import socket
    import struct

    data, anc, _flags, sender = sock.recvmsg(bufsize, socket.CMSG_SPACE(12))
    uid = None
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= 12:
            _pid, uid, _gid = struct.unpack("3i", payload[:12])
    if uid is None or uid not in (os.getuid(), 0):
        return None
    return data, sender
