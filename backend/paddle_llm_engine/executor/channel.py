"""What goes between the engine process and its tensor-parallel worker processes.

Control and step messages: pickled tuples over one Unix socket pair per worker
(multiprocessing.connection.Connection). A step message is the engine's Step (step.py: plain
data, a few KB), pickled once and sent to every rank; each rank packs it for its own kernels.
Logits: a file in /dev/shm mapped by the engine and every worker, [max_num_seqs, vocab] fp32; each
rank writes its vocabulary columns of the sampled rows, so the full rows exist once every rank has
answered, without a collective. The engine unlinks the file as soon as every worker mapped it.

Messages, engine -> worker: ("init", WorkerSpec), ("blocks", n), ("step", bytes of a pickled
Step), ("stop",).
worker -> engine: ("sized", n) (KV blocks this rank can hold), ("ready", PlatformPlan) (what the
rank decided to run: dtype, KV-cache dtype, kernels, quantization), ("done",), ("error", text)
(the worker exits after sending it).

A rank on another host (EngineConfig.tp_hosts, remote.py) talks over an authenticated TCP
connection instead: it first sends ("hello", rank, host name, pid) (the engine may answer
("reject", reason)); it has no shared memory, so its WorkerSpec has logits_path None and its
"done" carries its logits columns: ("done", (vocab_start, vocab_end, [rows, end - start] fp32)).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np


@dataclasses.dataclass
class WorkerSpec:
    """Everything a worker needs to build its shard (sent as the first message). device: the rank's
    Device; threads: its kernel threads (the platform layer's share of the host; 0 for a remote
    rank: it takes its own host's share); logits_path / logits_shape: the shared logits buffer
    ([rows, vocab] fp32; path None for a remote rank); ranks_on_host: the ranks of this engine on
    the rank's host (memory and threads are split between them; 0 = size); env: the
    paddle.distributed environment a remote rank sets before joining (local ranks get theirs at
    spawn)."""

    rank: int
    size: int
    device: object          # platforms.Device
    threads: int
    engine_config: object   # EngineConfig
    model_config: object    # ModelConfig of the whole model
    logits_path: str | None
    logits_shape: tuple[int, int]
    ranks_on_host: int = 0
    env: dict = dataclasses.field(default_factory=dict)


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
    """The map of a buffer made by create_logits_file (worker side)."""
    return np.memmap(path, dtype=np.float32, mode="r+", shape=tuple(shape))
