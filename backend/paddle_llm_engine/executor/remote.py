"""The step channel of tensor-parallel ranks on other hosts (EngineConfig.tp_hosts): TCP instead of
a socket pair, the same messages (channel.py) once a peer is authenticated.

Safety: the channel carries pickled model-execution commands, so
- the engine listens only on the first tp_hosts address (never 0.0.0.0), on tp_port, and only
  until every remote rank has joined;
- both ends prove they hold the shared token (PADDLE_LLM_TP_TOKEN, or the file named by
  PADDLE_LLM_TP_TOKEN_FILE; at least MIN_TOKEN_CHARS characters) with multiprocessing's HMAC
  challenge in both directions before anything is unpickled; a peer that fails it, is silent for
  HANDSHAKE_TIMEOUT_S, comes from another address than its tp_hosts entry, or claims a rank that
  is not remote or already joined is dropped (and logged);
- TCP keepalive and TCP_USER_TIMEOUT make a host that vanishes (no FIN) an error within
  ~KEEPALIVE_S instead of a silent hang.

RemoteRank stands for a remote rank where the executor keeps the Popen of a local one (pid, poll,
wait, kill): it is "running" while its connection is open.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import socket
import struct
import time
from multiprocessing.connection import AuthenticationError, Connection, answer_challenge, deliver_challenge

from paddle_llm_engine.executor.channel import Hello, Reject

log = logging.getLogger(__name__)

TOKEN_ENV = "PADDLE_LLM_TP_TOKEN"
TOKEN_FILE_ENV = "PADDLE_LLM_TP_TOKEN_FILE"
MIN_TOKEN_CHARS = 16
HANDSHAKE_TIMEOUT_S = 10.0
KEEPALIVE_S = 30
SIOCGIFADDR = 0x8915


def load_token(environ=os.environ) -> bytes:
    """The shared token: PADDLE_LLM_TP_TOKEN, else the contents of the file PADDLE_LLM_TP_TOKEN_FILE
    (surrounding whitespace stripped). Raises ValueError naming both variables when neither gives
    a token of at least MIN_TOKEN_CHARS characters."""
    token = environ.get(TOKEN_ENV, "")
    path = environ.get(TOKEN_FILE_ENV, "")
    if not token and path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read()
        except OSError as e:
            raise ValueError(f"{TOKEN_FILE_ENV}={path!r} cannot be read: {e}") from None
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"tensor parallel across hosts needs a shared token of at least {MIN_TOKEN_CHARS} "
                         f"characters in {TOKEN_ENV} (or a file named by {TOKEN_FILE_ENV}) on every host; "
                         f"got {len(token)} characters")
    return token.encode()


def resolve(host: str) -> set[str]:
    """The IPv4 addresses of a tp_hosts entry (a literal address resolves to itself). Raises
    ValueError naming tp_hosts when the name does not resolve."""
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)}
    except socket.gaierror as e:
        raise ValueError(f"tp_hosts: {host!r} does not resolve: {e}") from None


def interface_of(address: str) -> str | None:
    """The name of this host's network interface holding IPv4 `address`, None when none does. Gloo
    needs it (GLOO_SOCKET_IFNAME): it otherwise advertises the address the host name resolves to,
    often 127.0.0.1, which no other host can reach."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
        if socket.inet_ntoa(raw[20:24]) == address:
            return name
    return None


def tune(sock: socket.socket) -> None:
    """Low latency for the small step messages; keepalive and a user timeout so that a vanished
    peer host becomes a socket error within ~KEEPALIVE_S."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 4),
                       ("TCP_USER_TIMEOUT", KEEPALIVE_S * 1000)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


def _receive_timeout(sock: socket.socket, seconds: float) -> None:
    """SO_RCVTIMEO on a blocking socket: a Connection's reads on it fail after `seconds` (0: never)."""
    sec = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, int((seconds - sec) * 1e6)))


def authenticate(sock: socket.socket, token: bytes, engine_side: bool) -> Connection:
    """The Connection over `sock` once both ends proved they hold `token` (HMAC challenges both
    ways; the engine challenges first). Raises AuthenticationError on a wrong token, OSError /
    EOFError when the peer is silent for HANDSHAKE_TIMEOUT_S or goes away; `sock` is consumed."""
    tune(sock)
    sock.settimeout(None)
    _receive_timeout(sock, HANDSHAKE_TIMEOUT_S)
    conn = Connection(sock.detach())
    try:
        if engine_side:
            deliver_challenge(conn, token)
            answer_challenge(conn, token)
        else:
            answer_challenge(conn, token)
            deliver_challenge(conn, token)
        with socket.socket(fileno=os.dup(conn.fileno())) as s:
            _receive_timeout(s, 0)  # steps may take long: no read timeout from here on
    except BaseException:
        conn.close()
        raise
    return conn


class RemoteRank:
    """A rank on another host, with the part of subprocess.Popen's interface the executor uses.
    pid is the remote process id (as it reported it); poll() is None while the connection is open
    (a peek that consumes nothing, so the watchdog thread may call it between steps)."""

    def __init__(self, rank: int, host: str, pid: int, conn: Connection):
        self.rank, self.host, self.pid, self.conn = rank, host, pid, conn
        self.returncode: int | None = None
        self._peek = socket.socket(fileno=os.dup(conn.fileno()))

    def poll(self) -> int | None:
        """None while the connection is open, else 1 (closed or reset: the process or its host is gone)."""
        if self.returncode is None:
            try:
                if self._peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    self.returncode = 1
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.returncode = 1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to `timeout` s for the connection to close; the return code, None if still open."""
        deadline = time.monotonic() + (timeout or 0.0)
        while self.poll() is None and time.monotonic() < deadline:
            select.select([self._peek], [], [], max(0.0, min(0.2, deadline - time.monotonic())))
        return self.returncode

    def kill(self) -> None:
        """Close the connection: the remote worker exits on its end of file (tp_worker's watcher)."""
        try:
            self._peek.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self.returncode is None:
            self.returncode = 1
        self.release()

    def release(self) -> None:
        """Close this object's handle on the socket (the executor closes the Connection)."""
        self._peek.close()

    def describe(self) -> str:
        """How the rank ended, for processes.status."""
        if self.poll() is None:
            return "still running"
        return f"lost its connection from {self.host} (the process exited, was killed, or its host is unreachable)"


def listen(address: str, port: int) -> socket.socket:
    """The engine's listening socket on `address`:`port` (the first tp_hosts entry, tp_port).
    Raises ValueError naming tp_hosts / tp_port when this host cannot bind it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"tp_hosts / tp_port: cannot listen on {address}:{port} for the remote ranks (the first "
                         f"tp_hosts entry must be an address of this host, the port free): {e}") from None
    sock.listen(16)
    return sock


def _admit(sock: socket.socket, peer: str, token: bytes, waiting: dict[int, str],
           addresses: dict[int, set[str]]) -> RemoteRank | None:
    """One connection: authenticate it and read its Hello(rank, host name, pid). The RemoteRank,
    or None (logged, connection closed) for a peer that fails the token or claims a rank that is
    not waiting or belongs to another address."""
    try:
        conn = authenticate(sock, token, engine_side=True)
    except (AuthenticationError, OSError, EOFError) as e:
        log.warning("tensor parallel: rejected a connection from %s: %s", peer, e or type(e).__name__)
        return None
    try:
        hello = conn.recv()
        if not isinstance(hello, Hello):
            raise ValueError(f"expected Hello, got {type(hello).__name__}")
        rank, hostname, pid = hello.rank, hello.host, hello.pid
        if rank not in waiting:
            raise ValueError(f"rank {rank} is not a remote rank waiting to join (waiting: {sorted(waiting)})")
        if peer not in addresses[rank]:
            raise ValueError(f"rank {rank} belongs to tp_hosts entry {waiting[rank]!r} "
                             f"({', '.join(sorted(addresses[rank]))}), not {peer}")
    except (ValueError, TypeError, OSError, EOFError) as e:
        log.warning("tensor parallel: rejected %s: %s", peer, e)
        try:
            conn.send(Reject(str(e)))
        except OSError:
            pass
        conn.close()
        return None
    log.info("tensor parallel: rank %d joined from %s (%s, pid %s)", rank, peer, hostname, pid)
    return RemoteRank(rank, waiting.pop(rank), pid, conn)


def accept_ranks(listener: socket.socket, waiting: dict[int, str], token: bytes, timeout: float,
                 alive=lambda: None) -> dict[int, RemoteRank]:
    """Admit the remote ranks `waiting` ({rank: tp_hosts address}) as they connect, for at most
    `timeout` s. `alive()` is called between accepts (it raises when a local rank died, ending the
    wait). Returns {rank: RemoteRank}; raises TimeoutError naming the ranks still missing, their
    hosts and the command that starts them (the joined ones are closed first)."""
    waiting = dict(waiting)
    addresses = {r: resolve(h) for r, h in waiting.items()}
    joined: dict[int, RemoteRank] = {}
    deadline = time.monotonic() + timeout
    try:
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                host, port = listener.getsockname()
                missing = ", ".join(f"rank {r} on {h}" for r, h in sorted(waiting.items()))
                raise TimeoutError(f"{missing} did not join within {timeout:g} s (tp_join_timeout_s); start each "
                                   f"there with: PADDLE_LLM_TP_TOKEN=... python -m paddle_llm_engine.executor."
                                   f"tp_worker --connect {host}:{port} --rank <r>")
            alive()
            if select.select([listener], [], [], min(left, 1.0))[0]:
                sock, (peer, _) = listener.accept()
                got = _admit(sock, peer, token, waiting, addresses)
                if got is not None:
                    joined[got.rank] = got
    except BaseException:
        for rr in joined.values():
            rr.kill()
            rr.conn.close()
        raise
    return joined
