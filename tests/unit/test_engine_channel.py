"""The engine channel (paddle_llm_triton/engine_channel/): framing, discovery through the kernel's
socket table, one request per connection with its frames in order, abort by frame and by a closed
connection, errors as frames, a dead instance seen at once, least-loaded choice, and a peer that
stops reading cut off without delaying the others. Real sockets, a fake engine behind the handler."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time

import pytest

from paddle_llm_triton.engine_channel import address, wire
from paddle_llm_triton.engine_channel.client import ChannelClient, ChannelClosed, ChannelUnavailable
from paddle_llm_triton.engine_channel.server import ChannelServer

_pids = itertools.count(10_000_000 + os.getpid() * 100)  # fake "server pids": no clash with a real server


class Refused(Exception):
    channel_code = "invalid_arg"


class FakeEngine:
    """Handler: answers a generate frame with `parts` output frames, the last one final; waits for
    `gate` (when set) before the last; records starts and aborts. prompt_ids [-1] is refused."""

    def __init__(self, parts: int = 3, gate: threading.Event | None = None):
        self.parts, self.gate = parts, gate
        self.starts: list[dict] = []
        self.aborted: list[str] = []
        self.abort_seen = threading.Event()
        self._emits: dict[str, object] = {}

    def start(self, msg, emit):
        if msg.get("prompt_ids") == [-1]:
            raise Refused("input_ids: must be token ids")
        rid = f"req{len(self.starts)}"
        self.starts.append(msg)
        self._emits[rid] = emit
        threading.Thread(target=self._run, args=(rid, emit), daemon=True).start()
        return rid

    def _run(self, rid, emit):
        for i in range(self.parts):
            if i == self.parts - 1 and self.gate is not None:
                while not self.gate.wait(0.01):
                    if rid in self.aborted:
                        emit({"type": "output", "text": "", "finish_reason": "abort", "finished": True}, True)
                        return
            last = i == self.parts - 1
            emit({"type": "output", "text": f"{rid}:{i}", "finish_reason": "length" if last else "",
                  "finished": last}, last)

    def abort(self, rid):
        self.aborted.append(rid)
        self.abort_seen.set()


@pytest.fixture
def pid():
    return next(_pids)


def read_all(stream, timeout=5.0) -> list[dict]:
    frames = []
    while True:
        f = stream.next(timeout)
        frames.append(f)
        if f.get("type") == "error" or f.get("finished"):
            return frames


def test_frames_round_trip_in_pieces_and_refuse_garbage():
    msgs = [{"type": "generate", "prompt_ids": list(range(1000)), "text": "é😀"}, {"type": "abort"}]
    data = b"".join(wire.encode(m) for m in msgs)
    r = wire.FrameReader()
    got = []
    for i in range(0, len(data), 7):  # arbitrary cuts, as a stream socket delivers them
        got += r.feed(data[i:i + 7])
    assert got == msgs
    with pytest.raises(wire.FrameError, match="exceeds"):
        wire.FrameReader().feed(wire.HEADER.pack(wire.MAX_FRAME_BYTES + 1))
    with pytest.raises(wire.FrameError, match="not an object"):
        wire.FrameReader().feed(wire.HEADER.pack(2) + b"[]")
    with pytest.raises(wire.FrameError, match="not UTF-8 JSON"):
        wire.FrameReader().feed(wire.HEADER.pack(3) + b"{x}")


def test_listening_instances_come_from_the_kernel_socket_table(pid):
    assert address.listening_instances("llm", pid) == []
    a = ChannelServer("llm", "llm_0_1", FakeEngine(), pid=pid)
    b = ChannelServer("llm", "llm_0_0", FakeEngine(), pid=pid)
    other = ChannelServer("other", "other_0_0", FakeEngine(), pid=pid)
    try:
        assert address.listening_instances("llm", pid) == ["llm_0_0", "llm_0_1"]
        assert address.listening_instances("llm", pid + 1) == []
    finally:
        a.close(), b.close(), other.close()
    deadline = time.monotonic() + 5
    while address.listening_instances("llm", pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert address.listening_instances("llm", pid) == []


def test_one_request_per_connection_frames_in_order(pid):
    eng = FakeEngine(parts=4)
    srv = ChannelServer("llm", "llm_0_0", eng, pid=pid)
    try:
        client = ChannelClient("llm", pid=pid)
        s = client.open({"type": "generate", "prompt_ids": [1, 2, 3]})
        frames = read_all(s)
        assert [f["text"] for f in frames] == ["req0:0", "req0:1", "req0:2", "req0:3"]
        assert frames[-1]["finished"] and eng.starts[0]["prompt_ids"] == [1, 2, 3]
        with pytest.raises(ChannelClosed, match="already ended"):
            s.next(1)
        deadline = time.monotonic() + 5
        while srv.connections and time.monotonic() < deadline:  # closed after the final frame
            time.sleep(0.01)
        assert srv.connections == 0 and eng.aborted == []
    finally:
        srv.close()


def test_take_ready_returns_arrived_frames_without_waiting(pid):
    gate = threading.Event()
    eng = FakeEngine(parts=5, gate=gate)  # 4 frames at once, the final one after the gate
    srv = ChannelServer("llm", "llm_0_0", eng, pid=pid)
    try:
        s = ChannelClient("llm", pid=pid).open({"type": "generate", "prompt_ids": [1]})
        got = [s.next(5)]
        deadline = time.monotonic() + 5
        while len(got) < 4:  # the other three arrive without the gate
            assert time.monotonic() < deadline, got
            f = s.take_ready()
            if f is not None:
                got.append(f)
            else:
                time.sleep(0.005)
        t0 = time.monotonic()
        assert s.take_ready() is None  # nothing more has arrived: no wait
        assert time.monotonic() - t0 < 0.5
        gate.set()
        last = s.next(5)
        assert [f["text"] for f in got + [last]] == [f"req0:{i}" for i in range(5)] and last["finished"]
        assert s.take_ready() is None  # after the final frame: nothing, no error
    finally:
        srv.close()


def test_abort_frame_and_closed_connection_both_abort(pid):
    gate = threading.Event()
    eng = FakeEngine(parts=2, gate=gate)
    srv = ChannelServer("llm", "llm_0_0", eng, pid=pid)
    try:
        client = ChannelClient("llm", pid=pid)
        s = client.open({"type": "generate", "prompt_ids": [1]})
        assert s.next(5)["text"] == "req0:0"
        s.cancel()
        frames = read_all(s)
        assert frames[-1]["finish_reason"] == "abort" and eng.aborted == ["req0"]
        s2 = client.open({"type": "generate", "prompt_ids": [2]})
        assert s2.next(5)["text"] == "req1:0"
        eng.abort_seen.clear()
        s2.close()  # the ensemble went away (or its stub died): the request must not run on
        assert eng.abort_seen.wait(5) and eng.aborted == ["req0", "req1"]
    finally:
        gate.set()
        srv.close()


def test_a_refused_request_is_an_error_frame_with_its_code(pid):
    srv = ChannelServer("llm", "llm_0_0", FakeEngine(), pid=pid)
    try:
        frames = read_all(ChannelClient("llm", pid=pid).open({"type": "generate", "prompt_ids": [-1]}))
        assert frames == [{"type": "error", "code": "invalid_arg", "message": "input_ids: must be token ids"}]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address.address("llm", "llm_0_0", pid))
        s.sendall(wire.HEADER.pack(2) + b"[]")  # a frame that is not an object
        r = wire.FrameReader()
        got = []
        s.settimeout(5)
        while not got:
            got = r.feed(s.recv(4096))
        assert got[0]["type"] == "error" and "malformed frame" in got[0]["message"]
        s.close()
    finally:
        srv.close()


def test_an_instance_that_goes_away_is_seen_at_once_and_none_left_is_unavailable(pid):
    gate = threading.Event()
    srv = ChannelServer("llm", "llm_0_0", FakeEngine(parts=2, gate=gate), pid=pid)
    client = ChannelClient("llm", pid=pid)
    s = client.open({"type": "generate", "prompt_ids": [1]})
    assert s.next(5)["text"] == "req0:0"
    t0 = time.monotonic()
    srv.close()  # as when the stub process dies: the kernel closes its sockets
    with pytest.raises(ChannelClosed, match="llm instance llm_0_0 closed its engine channel"):
        s.next(30)
    assert time.monotonic() - t0 < 10
    with pytest.raises(ChannelUnavailable, match="no instance of model 'llm' is serving"):
        client.open({"type": "generate", "prompt_ids": [1]})
    gate.set()


def test_requests_go_to_the_least_loaded_instance(pid):
    gate = threading.Event()
    engines = {name: FakeEngine(parts=2, gate=gate) for name in ("llm_0_0", "llm_0_1")}
    servers = [ChannelServer("llm", name, eng, pid=pid) for name, eng in engines.items()]
    try:
        client = ChannelClient("llm", pid=pid)
        streams = [client.open({"type": "generate", "prompt_ids": [i]}) for i in range(6)]
        assert sorted(s.instance for s in streams).count("llm_0_0") == 3  # 3 + 3 while all are open
        for s in streams[:4]:
            s.close()
        left = [s.instance for s in streams[4:]]
        nxt = client.open({"type": "generate", "prompt_ids": [9]})
        if left[0] == left[1]:  # both open ones on one instance: the next goes to the other
            assert nxt.instance != left[0]
        nxt.close()
        for s in streams[4:]:
            s.close()
    finally:
        gate.set()
        for srv in servers:
            srv.close()


def test_a_peer_that_stops_reading_is_cut_off_and_others_are_served(pid):
    class Flood(FakeEngine):
        def _run(self, rid, emit):
            if rid == "req0":  # far more than the buffer bound, to a peer that never reads
                for _ in range(200):
                    emit({"type": "output", "text": "x" * 10000, "finished": False}, False)
                return
            super()._run(rid, emit)

    eng = Flood(parts=2)
    srv = ChannelServer("llm", "llm_0_0", eng, max_buffer_bytes=256 << 10, pid=pid)
    try:
        client = ChannelClient("llm", pid=pid)
        stuck = client.open({"type": "generate", "prompt_ids": [1]})  # never read
        assert eng.abort_seen.wait(10) and eng.aborted == ["req0"]
        frames = read_all(client.open({"type": "generate", "prompt_ids": [2]}))
        assert [f["text"] for f in frames] == ["req1:0", "req1:1"]
        stuck.close()
    finally:
        srv.close()
