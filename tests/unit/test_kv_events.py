"""KV-cache events (paddle_llm_engine/kv_events.py) as a KV-aware router receives them: a ZeroMQ SUB
socket and a DEALER replay socket against a real engine (tiny Llama, a KV cache small enough to evict),
the payloads decoded two independent ways: plain msgpack (the array layout vLLM documents) and
msgspec structs declared here as vLLM's example subscriber declares them. The events replayed from
sequence 0 must rebuild exactly the engine's cached block set after a mixed run with evictions, and
agree with the prefix-cache hits the engine reports (cached_tokens)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import zmq

from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams
from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.kv_events import offset_port


# -- the documented format, declared independently of the publisher's classes ------------------------
class RefBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class RefEvent(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class BlockStored(RefEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(RefEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(RefEvent):
    pass


class RefKVEventBatch(RefBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


BLOCK = 16


def _engine(model_dir, sock_dir, **kw) -> LLMEngine:
    cfg = dict(model_dir=model_dir, device="cpu", block_size=BLOCK, num_kv_blocks=12, max_model_len=128,
               max_num_seqs=4, max_num_batched_tokens=256, num_threads=2,
               kv_events_endpoint=f"ipc://{sock_dir}/pub", kv_events_replay_endpoint=f"ipc://{sock_dir}/replay",
               kv_events_topic="kv-events")
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


def _run(engine, reqs):
    cached = {}
    for rid, ids in reqs.items():
        engine.add_request(rid, ids, SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=20))
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                cached[o.request_id] = o.num_cached_tokens
    return cached


def _replay(addr: str, start: int = 0, timeout_ms: int = 10_000) -> list[tuple[int, bytes]]:
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.DEALER)  # a REQ socket would take the first of the many replies only
    req.connect(addr)
    req.send_multipart([b"", start.to_bytes(8, "big")])  # what a REQ socket sends: delimiter, request
    got = []
    try:
        while True:
            assert req.poll(timeout_ms), "no replay answer"
            empty, seq_bytes, payload = req.recv_multipart()
            assert empty == b""
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == -1:
                assert payload == b""
                return got
            got.append((seq, payload))
    finally:
        req.close(linger=0)


def _hits(prompt: list[int], cache: set, blocks: dict) -> int:
    """Prompt tokens a router expects cached: the longest chain of the prompt's full blocks (never the
    last token) found among the cached blocks by parent and tokens, hash function unknown to it."""
    n, parent = 0, None
    for i in range((len(prompt) - 1) // BLOCK):
        want = (parent, tuple(prompt[i * BLOCK:(i + 1) * BLOCK]))
        found = [h for h in cache if blocks[h] == want]
        if not found:
            break
        parent, n = found[0], n + BLOCK
    return n


def _apply(cache: set, batch: RefKVEventBatch) -> None:
    for ev in batch.events:
        if isinstance(ev, AllBlocksCleared):
            cache.clear()
        elif isinstance(ev, BlockStored):
            assert ev.block_size == BLOCK and len(ev.token_ids) == BLOCK * len(ev.block_hashes)
            assert ev.parent_block_hash is None or ev.parent_block_hash in cache, "parent not stored before"
            assert ev.medium == "CPU" and ev.lora_id is None
            cache.update(ev.block_hashes)
        else:
            assert set(ev.block_hashes) <= cache, "removal of a block never stored"
            cache.difference_update(ev.block_hashes)


def test_events_rebuild_the_cached_block_set_after_a_run_with_evictions(tiny_model_dir, tmp_path):
    engine = _engine(tiny_model_dir, tmp_path)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(f"ipc://{tmp_path}/pub")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    try:
        rng = np.random.default_rng(7)
        shared = rng.integers(100, 40000, size=40).tolist()  # a common prefix of 2 full blocks
        wave1 = {f"a{i}": shared + rng.integers(100, 40000, size=9 + i).tolist() for i in range(3)}
        wave2 = {f"b{i}": rng.integers(100, 40000, size=50).tolist() for i in range(3)}  # evicts
        wave3 = {"c0": shared + rng.integers(100, 40000, size=5).tolist(),
                 "c1": wave2["b2"][:40] + rng.integers(100, 40000, size=3).tolist()}
        cached = {}
        for wave in (wave1, wave2):
            cached.update(_run(engine, wave))
        before_wave3 = engine.kv_events.publisher.next_seq  # batches below it: the cache c0 / c1 meet
        cached.update(_run(engine, wave3))
        assert engine.kv_events.publisher.wait_sent(30)
        replayed = _replay(f"ipc://{tmp_path}/replay")
        assert [s for s, _ in replayed] == list(range(len(replayed))), "sequence numbers with gaps"
        cache: set[int] = set()
        blocks: dict[int, tuple] = {}  # hash -> (parent hash, token ids), as the events told
        decoder = msgspec.msgpack.Decoder(RefKVEventBatch)
        kinds = set()
        for seq, payload in replayed:
            if seq == before_wave3:
                predicted = {rid: _hits(wave3[rid], cache, blocks) for rid in wave3}
            raw = msgspec.msgpack.decode(payload)  # the layout, read without any struct
            assert isinstance(raw, list) and isinstance(raw[0], float) and isinstance(raw[1], list)
            for ev in raw[1]:
                kinds.add(ev[0])
                assert ev[0] in ("BlockStored", "BlockRemoved", "AllBlocksCleared")
                assert len(ev) == {"BlockStored": 7, "BlockRemoved": 3, "AllBlocksCleared": 1}[ev[0]]
            batch = decoder.decode(payload)
            for ev in batch.events:
                if isinstance(ev, BlockStored):
                    parent = ev.parent_block_hash
                    for i, h in enumerate(ev.block_hashes):
                        blocks[h] = (parent, tuple(ev.token_ids[i * BLOCK:(i + 1) * BLOCK]))
                        parent = h
            _apply(cache, batch)
        assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
        assert cache == engine.block_manager.cached_hashes()
        assert len(cache) > 0
        # the live subscriber got the same messages in the same order
        live = []
        while sub.poll(2000):
            topic, seq_bytes, payload = sub.recv_multipart()
            assert topic == b"kv-events"
            live.append((int.from_bytes(seq_bytes, "big"), payload))
        assert live == replayed[-len(live):] and len(live) >= len(replayed) - 1
        # the prefix hits the engine reported (cached_tokens) are what the events predicted
        assert {rid: cached[rid] for rid in wave3} == predicted
        assert predicted["c1"] == 2 * BLOCK and cached["a0"] == 0
    finally:
        sub.close(linger=0)
        engine.close()


def test_settings_are_checked_and_ports_offset_per_instance(tiny_model_dir):
    model = ModelConfig.from_dir(tiny_model_dir)
    with pytest.raises(ValueError, match="kv_events_endpoint"):
        EngineConfig(model_dir=tiny_model_dir, kv_events_endpoint="udp://x:1").validate(model)
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        EngineConfig(model_dir=tiny_model_dir, kv_events_endpoint="tcp://*:5557",
                     enable_prefix_caching=0).validate(model)
    with pytest.raises(ValueError, match="needs kv_events_endpoint"):
        EngineConfig(model_dir=tiny_model_dir, kv_events_replay_endpoint="tcp://*:5558").validate(model)
    assert offset_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_port("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_port("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_1"
    with pytest.raises(ValueError, match="kv_events_endpoint"):
        offset_port("tcp://host", 1)


def test_an_endpoint_in_use_refuses_the_start(tiny_model_dir, tmp_path):
    first = _engine(tiny_model_dir, tmp_path)
    try:
        sock = zmq.Context.instance().socket(zmq.PUB)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        try:
            with pytest.raises(zmq.ZMQError):
                _engine(tiny_model_dir, tmp_path / "x", kv_events_endpoint=f"tcp://127.0.0.1:{port}",
                        kv_events_replay_endpoint="")
        finally:
            sock.close(linger=0)
    finally:
        first.close()
