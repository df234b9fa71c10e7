"""What goes between the engine process and its tensor-parallel workers.

Control and step messages: pickled tuples over one Unix socket pair per worker
(multiprocessing.connection.Connection). A step message is the runner's packed step (token ids,
positions, attention metadata with the slot mapping and context slots, the rows to sample, the
copy-on-write block copies): a few KB, pickled once and sent to every rank.
Logits: a file in /dev/shm mapped by the engine and every worker, [max_num_seqs, vocab] fp32;
each rank writes its vocabulary columns of the sampled rows, so the full rows exist once every rank
has answered, without a collective. The engine unlinks the file as soon as every worker mapped it.

Messages, engine -> worker: ("init", WorkerSpec), ("blocks", n), ("step", bytes of a pickled
(copies, wire(input_ids, positions, meta), last_rows)), ("stop",).
worker -> engine: ("sized", n) (KV blocks this rank can hold), ("ready", decode_metadata) (the
form of decode metadata its OpSet reads: "slots" or "block_tables"), ("done",),
("error", text) (the worker exits after sending it).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import NamedTuple

import numpy as np


@dataclasses.dataclass
class WorkerSpec:
    """Everything a worker needs to build its shard (sent as the first message)."""

    rank: int
    size: int
    device: str
    engine_config: object   # EngineConfig (num_threads already per worker)
    model_config: object    # ModelConfig of the whole model
    logits_path: str
    logits_shape: tuple[int, int]


class _Tensor(NamedTuple):
    """A paddle tensor on the wire: its values."""
    array: np.ndarray


class _Dataclass(NamedTuple):
    """A dataclass instance on the wire: its class and attributes."""
    cls: type
    attrs: dict


def to_wire(x):
    """paddle tensors -> numpy, recursively through dataclasses, lists and tuples."""
    import paddle

    if isinstance(x, paddle.Tensor):
        return _Tensor(x.numpy())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _Dataclass(type(x), {k: to_wire(v) for k, v in vars(x).items()})
    if isinstance(x, (list, tuple)):
        return type(x)(to_wire(v) for v in x)
    return x


def from_wire(x):
    """The inverse of to_wire: numpy -> paddle tensors on the current device."""
    import paddle

    if isinstance(x, _Tensor):
        return paddle.to_tensor(x.array)
    if isinstance(x, _Dataclass):
        obj = x.cls.__new__(x.cls)
        obj.__dict__.update({k: from_wire(v) for k, v in x.attrs.items()})
        return obj
    if isinstance(x, (list, tuple)):
        return type(x)(from_wire(v) for v in x)
    return x


def create_logits_file(rows: int, vocab: int) -> tuple[str, np.memmap]:
    """A new shared logits buffer [rows, vocab] fp32 in /dev/shm (else the temp dir) and its map."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix=f"paddle_llm_tp_logits_{os.getpid()}_", dir=folder)
    try:
        os.ftruncate(fd, rows * vocab * 4)
    finally:
        os.close(fd)
    return path, np.memmap(path, dtype=np.float32, mode="r+", shape=(rows, vocab))


def open_logits_file(path: str, shape: tuple[int, int]) -> np.memmap:
    return np.memmap(path, dtype=np.float32, mode="r+", shape=tuple(shape))
