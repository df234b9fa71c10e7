"""TPExecutor: an engine's model sharded over `tensor_parallel_size` worker processes, one per
device, each running a Worker on its shard (tp_worker.py). This process sends each Step to every
rank, waits for all of them, and reads the sampled rows' logits that the ranks assembled in shared
memory (channel.py); it loads no weights and runs no kernel.

Workers are watched on every wait: a worker that exits (crash, SIGKILL, a failed step) makes the
step raise WorkerFailure naming its rank, pid and exit status, after the other ranks (then stuck in
a collective) are killed; the engine loop fails the requests in flight with it, as for any engine
failure. Start-up waits the same way, so a worker that fails to load fails the start with its own
error, and no worker is left behind. close() (LLMEngine.close, also at interpreter exit) stops
them: "stop", then SIGKILL after processes.STOP_GRACE_S.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection, wait

import numpy as np

from paddle_llm_engine.config import EngineConfig, ModelConfig
from paddle_llm_engine.executor import processes
from paddle_llm_engine.executor.channel import WorkerSpec, create_logits_file
from paddle_llm_engine.platforms import Device, PlatformPlan, platform_for
from paddle_llm_engine.step import Step
from paddle_llm_engine.tp.shard import check_tensor_parallel

log = logging.getLogger(__name__)

START_TIMEOUT_S = 900.0  # importing paddle and loading a shard, on a busy host
STEP_TIMEOUT_S = 900.0   # a step on which no rank answers for this long is a hung worker


class WorkerFailure(RuntimeError):
    """A tensor-parallel worker died, reported an error, or stopped answering."""


def _plan_key(plan: PlatformPlan) -> tuple:
    """What every rank must have decided alike."""
    return plan.dtype, plan.kv_cache_dtype, tuple(sorted(plan.kernels.items())), plan.cpu_isa, plan.quantization


class TPExecutor:
    """N worker processes behind the executor interface (executor/__init__.py).

    Raises ValueError at start for a tensor_parallel_size the model's heads or the devices do not
    allow (naming both numbers), WorkerFailure when a worker fails to start."""

    def __init__(self, engine_config: EngineConfig, model_config: ModelConfig, device: Device):
        import paddle

        self.size = n = engine_config.tensor_parallel_size
        check_tensor_parallel(n, model_config.num_attention_heads, model_config.num_key_value_heads)
        self.device = device
        self.platform = platform_for(device)
        self.devices = self.platform.rank_devices(n, device)
        paddle.set_device("cpu")  # this process never computes: nothing of it may land on a device
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        self.error: str | None = None
        self._logits_path, self._logits = create_logits_file(engine_config.max_num_seqs, model_config.vocab_size)
        self._finalizer = weakref.finalize(self, processes.stop_workers, self._procs, self._conns, self._logits_path)
        t0 = time.monotonic()
        try:
            self._start(engine_config, model_config)
        except BaseException:
            self.close()
            raise
        log.info("tensor parallel: %d workers on %s ready in %.1f s (pids %s), %d KV blocks per rank",
                 n, ", ".join(self.devices), time.monotonic() - t0, self.worker_pids, self.num_kv_blocks)

    # -- processes -------------------------------------------------------------------------------
    def _environments(self) -> list[dict]:
        """Each rank's environment: paddle.distributed's rendezvous and the collective backend the
        platform layer names for its device; PYTHONPATH so that the worker imports this code."""
        n, port = self.size, processes.free_port()
        ends = ",".join(f"127.0.0.1:{port + r}" for r in range(n))
        base = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))
        return [dict(base, PADDLE_TRAINER_ID=str(r), PADDLE_TRAINERS_NUM=str(n), PADDLE_TRAINER_ENDPOINTS=ends,
                     PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{port + r}", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                     PADDLE_RANK_IN_NODE=str(r), PADDLE_LOCAL_SIZE=str(n),
                     **self.platform.collective_env(self.devices[r]))
                for r in range(n)]

    def _start(self, engine_config: EngineConfig, model_config: ModelConfig) -> None:
        """Spawn the ranks, agree on the KV-cache size (every rank allocates the smallest count any
        of them can hold) and collect their platform plans."""
        try:
            self._conns.extend(processes.spawn_workers(self._environments(), self._procs))
        except RuntimeError as e:
            raise WorkerFailure(str(e)) from None
        threads = self.platform.kernel_threads(engine_config.num_threads, self.size)
        for r, c in enumerate(self._conns):
            c.send(("init", WorkerSpec(r, self.size, self.devices[r], threads, engine_config, model_config,
                                       self._logits_path, tuple(self._logits.shape))))
        sized = self._gather("sized", START_TIMEOUT_S, "start")
        self.num_kv_blocks = min(m[1] for m in sized)
        for c in self._conns:
            c.send(("blocks", self.num_kv_blocks))
        plans = [m[1] for m in self._gather("ready", START_TIMEOUT_S, "start")]
        if len({_plan_key(p) for p in plans}) != 1:
            self._fail(f"ranks decided different platform plans ({sorted({_plan_key(p) for p in plans})})")
        self.plan = plans[0]
        try:  # every rank has mapped it: nothing to clean up if this process is killed later
            os.unlink(self._logits_path)
        except FileNotFoundError:
            pass

    def _gather(self, kind: str, timeout: float, what: str) -> list:
        """One message of `kind` from every rank, in rank order. Raises WorkerFailure (after
        killing every worker) when a rank reports an error, exits, or is silent for `timeout` s."""
        got: dict[int, tuple] = {}
        pending = {c: r for r, c in enumerate(self._conns)}
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"no answer from rank(s) {sorted(pending.values())} within {timeout:.0f} s ({what})")
            for c in wait(list(pending), timeout=min(left, 1.0)):
                r = pending.pop(c)
                got[r] = self._receive(c, r, kind, what)
            for c, r in list(pending.items()):  # a worker can die without its socket closing yet
                p = self._procs[r]
                if p.poll() is not None and not c.poll():
                    self._fail(f"rank {r} (pid {p.pid}, {self.devices[r]}) {processes.status(p)} ({what})")
        return [got[r] for r in range(len(self._conns))]

    def _receive(self, c: Connection, r: int, kind: str, what: str) -> tuple:
        """Rank r's next message, which must be of `kind` (else WorkerFailure, as _gather)."""
        try:
            msg = c.recv()
        except (EOFError, OSError):
            p = self._procs[r]
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                pass
            self._fail(f"rank {r} (pid {p.pid}, {self.devices[r]}) {processes.status(p)} ({what})")
        if msg[0] == "error":
            self._fail(f"{self._dead_peer(r)}rank {r} ({self.devices[r]}) failed ({what}): {msg[1]}")
        if msg[0] != kind:
            self._fail(f"rank {r} sent {msg[0]!r} instead of {kind!r} ({what})")
        return msg

    def _dead_peer(self, r: int, wait_s: float = 0.5) -> str:
        """"rank q (pid, device) killed by SIGKILL; then " for a rank other than r that a signal ended
        (waiting at most wait_s for one), else "". A rank whose collective failed because its peer
        was killed reports first as often as not (gloo: "Connection reset by peer"): the killed rank
        is the cause, so it is named first. A peer that exited by itself (after reporting its own
        error) is not."""
        deadline = time.monotonic() + wait_s
        while True:
            for q, p in enumerate(self._procs):
                if q != r and p.poll() is not None and p.returncode < 0:
                    return f"rank {q} (pid {p.pid}, {self.devices[q]}) {processes.status(p)}; then "
            if time.monotonic() >= deadline:
                return ""
            time.sleep(0.02)

    def _fail(self, reason: str):
        self.error = reason
        self.close()
        raise WorkerFailure(f"tensor-parallel worker {reason}")

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        self._finalizer()

    def dead_worker(self) -> str | None:
        """A rank whose process has exited although the workers were not stopped, named with its
        pid, device and how it ended ("tensor-parallel worker rank 1 (pid 123, cpu) killed by SIGKILL"); None when every
        rank runs or the executor is closed. Thread-safe (only polls the processes): a watchdog
        calls it between steps, when no step would notice a dead rank."""
        procs = list(self._procs)
        if not self._conns or self.error is not None:  # stopped, or a failure already reported
            return None
        for r, p in enumerate(procs):
            if p.poll() is not None:
                return f"tensor-parallel worker rank {r} (pid {p.pid}, {self.devices[r]}) {processes.status(p)}"
        return None

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the worker processes, in rank order (empty once stopped)."""
        return [p.pid for p in self._procs]

    # -- one step --------------------------------------------------------------------------------
    def execute(self, step: Step) -> np.ndarray:
        """Send `step` to every rank and return the sampled rows' logits, [step.num_sampled, vocab]
        fp32 (a copy out of shared memory). Raises WorkerFailure naming a rank that failed."""
        if not self._conns:
            raise WorkerFailure(f"the tensor-parallel workers are stopped ({self.error or 'closed'})")
        rows = step.num_sampled
        if rows > self._logits.shape[0]:
            raise RuntimeError(f"{rows} rows to sample exceed the logits buffer's {self._logits.shape[0]}")
        data = pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL)
        for c in self._conns:
            try:
                c.send(("step", data))
            except OSError:
                pass  # the rank is gone: _gather names it
        self._gather("done", STEP_TIMEOUT_S, "step")
        return np.array(self._logits[:rows])
