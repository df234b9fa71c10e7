"""What goes between the engine process and its tensor-parallel worker processes.

Control and step messages: pickled message objects over one Unix socket pair per worker
(multiprocessing.connection.Connection). A step message is the engine's Step (step.py: plain
data, a few KB), pickled once and sent to every rank; each rank packs it for its own kernels.
Logits: a file in /dev/shm mapped by the engine and every worker, [max_num_seqs, vocab] fp32; each
rank writes its vocabulary columns of the sampled rows, so the full rows exist once every rank has
answered, without a collective. The engine unlinks the file as soon as every worker mapped it.

Messages (the dataclasses below), engine -> worker: Init(WorkerSpec), Blocks(n), RunStep(bytes of a
pickled Step), Stop().
worker -> engine: Sized(n) (KV blocks this rank can hold), Ready(PlatformPlan) (what the rank decided
to run: dtype, KV-cache dtype, kernels, quantization), Done(), Failed(text) (the worker exits after
sending it).

A rank on another host (EngineConfig.tp_hosts, remote.py) talks over an authenticated TCP
connection instead: it first sends Hello(rank, host name, pid) (the engine may answer
Reject(reason)); it has no shared memory, so its WorkerSpec has logits_path None and its Done
carries its logits columns: Done((vocab_start, vocab_end, [rows, end - start] fp32)).
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


@dataclasses.dataclass(frozen=True, slots=True)
class Init:
    """engine -> worker, first: the rank's WorkerSpec."""

    spec: WorkerSpec


@dataclasses.dataclass(frozen=True, slots=True)
class Blocks:
    """engine -> worker: the agreed KV-cache size, in blocks (the smallest any rank can hold)."""

    n: int


@dataclasses.dataclass(frozen=True, slots=True)
class RunStep:
    """engine -> worker: one step, the engine's Step pickled once for every rank."""

    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    """engine -> worker: exit (also before Init, when the start failed elsewhere)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sized:
    """worker -> engine: the KV blocks this rank can hold."""

    n: int


@dataclasses.dataclass(frozen=True, slots=True)
class Ready:
    """worker -> engine: the cache is allocated; the rank's PlatformPlan (dtype, kernels, ...)."""

    plan: object


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    """worker -> engine: the step ran. columns: a remote rank's logits, (vocab_start, vocab_end,
    [rows, vocab_end - vocab_start] fp32); None for a local rank (it wrote the shared file)."""

    columns: tuple | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    """worker -> engine: the rank failed ("Type: message"); it exits after sending this."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    """remote worker -> engine, first after authentication: who is joining."""

    rank: int
    host: str
    pid: int


@dataclasses.dataclass(frozen=True, slots=True)
class Reject:
    """engine -> remote worker, instead of Init: why the rank was not admitted."""

    reason: str


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
