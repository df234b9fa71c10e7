"""Abstract Unix sockets have no file permissions: the control bus (drain, stop, status) and the
supervisor's failure notices take datagrams from their own user only (unix_names.recv_same_user,
the kernel's SCM_CREDENTIALS). A sender of another uid is a real process here (setuid to nobody;
the tests run as root, as CI does, and say so when they cannot)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from paddle_llm_triton.engine_channel import control_bus
from paddle_llm_triton.engine_channel.control_bus import ControlBus

NOBODY = 65534


def _send_as(uid: int | None, address: str, payload: str) -> None:
    """Send one datagram from a forked child running as `uid` (None: this process's user)."""
    if uid is not None and os.geteuid() != 0:
        pytest.fail("sending as another user needs root (CI runs as root)")
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit (no test machinery runs here)
        code = 1
        try:
            if uid is not None:
                os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(payload.encode(), address)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the sender failed"


def test_the_control_bus_ignores_another_users_drain_and_serves_its_own():
    seen: list[dict] = []
    got = threading.Event()

    def on_drain(msg):
        seen.append(msg)
        got.set()

    bus = ControlBus("llm", "llm_0_0", {"drain": on_drain}, server_pid=990001)
    try:
        assert bus.listening
        addr = control_bus.address(990001, "llm", "llm_0_0")
        _send_as(NOBODY, addr, '{"type": "drain", "grace_s": 1}')
        time.sleep(0.5)
        assert seen == [], "a datagram of another user was handled"
        _send_as(None, addr, '{"type": "drain", "grace_s": 2}')
        assert got.wait(10)
        assert seen == [{"type": "drain", "grace_s": 2}]
    finally:
        bus.close()


def test_ask_collects_replies_of_its_own_user():
    bus = ControlBus("llm", "llm_0_0", {"status": lambda msg: {"type": "status", "model": "llm",
                                                               "instance": "llm_0_0", "in_flight": 0}},
                     server_pid=990002)
    try:
        replies = control_bus.ask(990002, [("llm", "llm_0_0")], {"type": "status"}, timeout=5)
        assert replies[("llm", "llm_0_0")]["in_flight"] == 0
    finally:
        bus.close()
