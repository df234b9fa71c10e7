"""KV-cache events for KV-aware routers: the prefix cache's changes, published as vLLM publishes
them, so that a router that reads vLLM's events (NVIDIA Dynamo's KV router, llm-d's precise
prefix-cache scorer) can place a request on the instance that already holds its prefix.

Wire format (vLLM's `vllm.distributed.kv_events`, the layout of vLLM 0.9 to 0.11 that those routers
decode): msgpack, structs as arrays, events tagged with their class name:
    KVEventBatch      = [ts (float, Unix seconds), [event, ...], data_parallel_rank (0)]
    BlockStored       = ["BlockStored", block_hashes, parent_block_hash | nil, token_ids, block_size,
                         lora_id (the engine's id of the adapter the blocks were computed with, nil for
                         the base model), medium]
    BlockRemoved      = ["BlockRemoved", block_hashes, medium]
    AllBlocksCleared  = ["AllBlocksCleared"]
Transport: a ZeroMQ PUB socket sends multipart messages (topic, sequence number as 8 bytes
big-endian, payload); an optional ROUTER replay socket answers a request carrying a start sequence
number (8 bytes big-endian) with every buffered (sequence, payload) from there on, then (-1, b""):
many replies to one request, so the client is a DEALER socket sending (b"", start) (a REQ socket
takes only the first reply).

Block hashes are this engine's prefix-cache chain hashes (block_manager.chain_hash: signed 64-bit
integers over the block's tokens and its parent's hash), so a BlockStored's parent links to an
earlier BlockStored; they are not vLLM's sha256 hashes, so a consumer that recomputes vLLM's hash
from the token ids will not match them (Dynamo keys blocks on the token ids it receives).

The engine thread only converts and enqueues (bounded queue, never blocking); a daemon thread owns
the sockets. Sequence numbers are given at enqueue time: a batch dropped on a full queue leaves a gap
that subscribers see (and that replay cannot fill), instead of a silent divergence.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import msgspec
import zmq

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the three events (tagged by class name on the wire)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def to_events(raw: list[tuple], block_size: int, medium: str) -> list[KVCacheEvent]:
    """BlockManager.events entries -> wire events (same order)."""
    out: list[KVCacheEvent] = []
    for e in raw:
        if e[0] == "stored":
            out.append(BlockStored(list(e[1]), e[2], list(e[3]), block_size, e[4] if len(e) > 4 else None, medium))
        else:
            out.append(BlockRemoved(list(e[1]), medium))
    return out


def offset_port(endpoint: str, k: int) -> str:
    """Instance k's endpoint: a tcp port + k (as vLLM offsets by data-parallel rank), an ipc path
    + "_<k>"; k = 0 unchanged. Raises ValueError for another scheme or a tcp endpoint without a port."""
    if not endpoint or k == 0:
        return endpoint
    if endpoint.startswith("ipc://"):
        return f"{endpoint}_{k}"
    if endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[-1].isdigit():
        base, port = endpoint.rsplit(":", 1)
        return f"{base}:{int(port) + k}"
    raise ValueError(f"kv_events_endpoint: expected tcp://<host>:<port> or ipc://<path>, got {endpoint!r}")


class KVEventPublisher:
    """PUB (+ optional ROUTER replay) publisher of KVEventBatch messages (module doc).

    endpoint / replay_endpoint: ZeroMQ addresses to bind (e.g. "tcp://*:5557", "tcp://127.0.0.1:5558",
    "ipc:///tmp/kv"); topic: the first frame of every message; buffer_steps: batches kept for replay;
    max_queue: batches waiting for the thread before publish() drops. Raises zmq.ZMQError when an
    address cannot be bound (in use, bad host)."""

    def __init__(self, endpoint: str, replay_endpoint: str = "", topic: str = "", buffer_steps: int = 10_000,
                 max_queue: int = 10_000, hwm: int = 100_000, rank: int = 0):
        self.rank = rank  # KVEventBatch.data_parallel_rank (vLLM always sends one; 0 here)
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._replay = None
        try:
            self._pub.bind(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._topic = topic.encode()
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._sent = threading.Condition()
        self._last_sent = -1  # sequence number of the last batch sent (or dropped)
        self.dropped = 0  # batches dropped on a full queue, since start
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[KVCacheEvent]) -> None:
        """Enqueue one batch (engine thread; never blocks). A full queue drops it (counted, logged)."""
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        try:
            self._queue.put_nowait((seq, KVEventBatch(time.time(), events, self.rank)))
        except queue.Full:
            self._mark_sent(seq)
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.warning("KV events: %d batch(es) dropped, the publisher thread fell behind", self.dropped)

    @property
    def next_seq(self) -> int:
        """The sequence number the next published batch gets."""
        return self._next_seq

    def wait_sent(self, timeout: float) -> bool:
        """True once every batch published so far was sent (False after `timeout` seconds)."""
        with self._sent:
            return self._sent.wait_for(lambda: self._last_sent >= self._next_seq - 1, timeout)

    def _mark_sent(self, seq: int) -> None:
        with self._sent:
            self._last_sent = max(self._last_sent, seq)
            self._sent.notify_all()

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (at most `timeout` seconds), then close the sockets; idempotent."""
        if self._thread.is_alive():
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                pass
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self._close_sockets()

    def _close_sockets(self) -> None:
        for s in (self._pub, self._replay):
            if s is not None:
                s.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        enc = msgspec.msgpack.Encoder()
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            seq, batch = item
            payload = enc.encode(batch)
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except zmq.ZMQError as e:  # a PUB socket does not block; keep the batch for replay
                log.warning("KV events: send failed: %s", e)
            self._buffer.append((seq, payload))
            self._mark_sent(seq)

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("KV events: replay request with %d frames ignored (expected a REQ socket's 3)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))


class KVEventSource:
    """The engine's side: owns the publisher, takes the block manager's recorded changes after each
    step and publishes them as one batch. The first batch is AllBlocksCleared (a new engine starts
    with an empty cache, so a router drops what it knew of an earlier one on the same address)."""

    def __init__(self, block_manager, publisher: KVEventPublisher, medium: str):
        self.blocks, self.publisher, self.medium = block_manager, publisher, medium
        block_manager.events = []
        publisher.publish([AllBlocksCleared()])

    def flush(self) -> None:
        raw = self.blocks.events
        if raw:
            self.blocks.events = []
            self.publisher.publish(to_events(raw, self.blocks.block_size, self.medium))

    def close(self) -> None:
        self.flush()
        self.publisher.close()


def start_kv_events(config, block_manager, device) -> KVEventSource | None:
    """The engine's source for EngineConfig.kv_events_* (None when kv_events_endpoint is empty).
    medium: the device type, upper case ("CPU", "GCU"). Raises zmq.ZMQError when an endpoint cannot
    be bound."""
    if not config.kv_events_endpoint:
        return None
    pub = KVEventPublisher(config.kv_events_endpoint, config.kv_events_replay_endpoint, config.kv_events_topic)
    return KVEventSource(block_manager, pub, str(device).split(":")[0].upper())
