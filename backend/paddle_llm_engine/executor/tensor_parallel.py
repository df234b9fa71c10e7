"""TPExecutor: an engine's model sharded over `tensor_parallel_size` worker processes, one per
device, each running a Worker on its shard (tp_worker.py). This process sends each Step to every
rank, waits for all of them, and reads the sampled rows' logits that the ranks assembled in shared
memory (channel.py); it loads no weights and runs no kernel.

Workers are watched on every wait: a worker that exits (crash, SIGKILL, a failed step) makes the
step raise WorkerFailure naming its rank, pid and exit status, after the other ranks (then stuck in
a collective) are killed; the engine loop fails the requests in flight with it, as for any engine
failure. Start-up waits the same way, so a worker that fails to load fails the start with its own
error, and no worker is left behind. close() (LLMEngine.close, also at interpreter exit) stops
them: Stop, then SIGKILL after processes.STOP_GRACE_S.

Across hosts (EngineConfig.tp_hosts): the ranks of the first entry are started here as above; the
others are started on their hosts by the operator (tp_worker.py --connect) and join over TCP
(remote.py: bound to the first address, token-authenticated) within tp_join_timeout_s. Every rank
gets paddle.distributed's launcher environment (PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM,
PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT, PADDLE_MASTER: the TCP store that rank 0
hosts on the first address; GLOO_SOCKET_IFNAME: the interface of the rank's own address).
A remote rank sends its logits columns with its Done; its death is its connection closing
(or TCP keepalive giving up), named like a local one with its host.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection, wait

import numpy as np

from paddle_llm_engine.config import EngineConfig, ModelConfig, parse_tp_hosts
from paddle_llm_engine.executor import processes, remote
from paddle_llm_engine.executor.channel import (Blocks, Done, Failed, Init, Ready, RunStep, Sized, WorkerSpec,
                                                create_logits_file)
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
        self.hosts = parse_tp_hosts(engine_config.tp_hosts, n) if engine_config.tp_hosts.strip() else [("", n)]
        self.local_size = self.hosts[0][1]
        self.rank_hosts = [h for h, count in self.hosts for _ in range(count)]
        self.devices = self.platform.rank_devices(self.local_size, device) + [
            Device(device.kind, device.index + j) for _, count in self.hosts[1:] for j in range(count)]
        self._token = remote.load_token() if len(self.hosts) > 1 else None
        paddle.set_device("cpu")  # this process never computes: nothing of it may land on a device
        self._procs: list = []  # subprocess.Popen of a local rank, remote.RemoteRank of a remote one
        self._conns: list[Connection] = []
        self.error: str | None = None
        # rows: one per sequence, 1 + num_speculative_tokens with speculative decoding (step.py)
        rows = engine_config.max_num_seqs * (1 + engine_config.num_speculative_tokens if engine_config.speculative else 1)
        self._logits_path, self._logits = create_logits_file(rows, model_config.vocab_size)
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
        """Each local rank's environment: paddle.distributed's rendezvous and the collective backend
        the platform layer names for its device; PYTHONPATH so that the worker imports this code."""
        n, port = self.size, processes.free_port()
        ends = ",".join(f"127.0.0.1:{port + r}" for r in range(n))
        base = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))
        return [dict(base, PADDLE_TRAINER_ID=str(r), PADDLE_TRAINERS_NUM=str(n), PADDLE_TRAINER_ENDPOINTS=ends,
                     PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{port + r}", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                     PADDLE_RANK_IN_NODE=str(r), PADDLE_LOCAL_SIZE=str(n),
                     **self.platform.collective_env(self.devices[r]))
                for r in range(n)]

    def _distributed_envs(self) -> list[dict]:
        """Across hosts: every rank's paddle.distributed environment (no process environment). The
        TCP store (PADDLE_MASTER, which Paddle 3.3's C++ store reads before the first endpoint) is
        hosted by rank 0 on the first tp_hosts address; the endpoints only name the ranks' hosts
        (gloo binds its own ports, on GLOO_SOCKET_IFNAME's address)."""
        first = sorted(remote.resolve(self.hosts[0][0]))[0]
        with socket.socket() as s:
            s.bind((first, 0))
            port = s.getsockname()[1]
        addrs = [first if r < self.local_size else h for r, h in enumerate(self.rank_hosts)]
        ends = ",".join(f"{a}:{port + r}" for r, a in enumerate(addrs))
        envs, start = [], 0
        for _, count in self.hosts:
            for j in range(count):
                r = start + j
                envs.append(dict(PADDLE_TRAINER_ID=str(r), PADDLE_TRAINERS_NUM=str(self.size),
                                 PADDLE_TRAINER_ENDPOINTS=ends, PADDLE_CURRENT_ENDPOINT=f"{addrs[r]}:{port + r}",
                                 PADDLE_MASTER=f"{first}:{port}", MASTER_ADDR=first, MASTER_PORT=str(port),
                                 PADDLE_RANK_IN_NODE=str(j), PADDLE_LOCAL_SIZE=str(count),
                                 **self.platform.collective_env(self.devices[r])))
            start += count
        iface = remote.interface_of(first)
        for env in envs[:self.local_size]:
            if iface and "GLOO_SOCKET_IFNAME" not in os.environ:
                env["GLOO_SOCKET_IFNAME"] = iface
        return envs

    def _spawn(self) -> list[dict]:
        """Start the local ranks; returns every rank's paddle.distributed environment (the remote
        ranks get theirs with Init)."""
        if len(self.hosts) == 1:
            envs, dist_envs = self._environments(), [{} for _ in range(self.size)]
        else:
            dist_envs = self._distributed_envs()
            base = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))
            envs = [dict(base, **e) for e in dist_envs[:self.local_size]]
        try:
            self._conns.extend(processes.spawn_workers(envs, self._procs))
        except RuntimeError as e:
            raise WorkerFailure(str(e)) from None
        return dist_envs

    def _join(self, engine_config: EngineConfig) -> None:
        """Wait (tp_join_timeout_s at most) for the remote ranks to connect to the first tp_hosts
        address on tp_port. Raises WorkerFailure naming the missing ranks and hosts, or a local
        rank that died meanwhile."""
        listener = remote.listen(sorted(remote.resolve(self.hosts[0][0]))[0], engine_config.tp_port)

        def alive():
            for r, p in enumerate(self._procs):
                if p.poll() is not None:
                    self._fail(f"{self._who(r)} {processes.status(p)} (start)")

        waiting = {r: self.rank_hosts[r] for r in range(self.local_size, self.size)}
        try:
            joined = remote.accept_ranks(listener, waiting, self._token, engine_config.tp_join_timeout_s, alive)
        except TimeoutError as e:
            self._fail(str(e))
        finally:
            listener.close()
        for r in sorted(joined):
            self._procs.append(joined[r])
            self._conns.append(joined[r].conn)

    def _spec(self, r: int, engine_config: EngineConfig, model_config: ModelConfig, env: dict) -> WorkerSpec:
        """Rank r's WorkerSpec: a local rank shares the logits file and this host's threads; a
        remote one (r >= local_size) gets its distributed environment and sizes its own threads."""
        if r < self.local_size:
            threads = self.platform.kernel_threads(engine_config.num_threads, self.local_size)
            return WorkerSpec(r, self.size, self.devices[r], threads, engine_config, model_config, self._logits_path,
                              tuple(self._logits.shape), ranks_on_host=self.local_size)
        on_host = next(count for h, count in self.hosts if h == self.rank_hosts[r])
        return WorkerSpec(r, self.size, self.devices[r], engine_config.num_threads, engine_config, model_config, None,
                          tuple(self._logits.shape), ranks_on_host=on_host, env=env)

    def _who(self, r: int) -> str:
        """"rank 1 (pid 123, cpu)", or for a remote rank "rank 1 (pid 123 on 10.0.0.2, cpu)"."""
        p = self._procs[r]
        where = f" on {p.host}" if isinstance(p, remote.RemoteRank) else ""
        return f"rank {r} (pid {p.pid}{where}, {self.devices[r]})"

    def _start(self, engine_config: EngineConfig, model_config: ModelConfig) -> None:
        """Spawn the ranks, agree on the KV-cache size (every rank allocates the smallest count any
        of them can hold) and collect their platform plans."""
        dist_envs = self._spawn()
        if self.size > self.local_size:
            self._join(engine_config)
        for r, c in enumerate(self._conns):
            c.send(Init(self._spec(r, engine_config, model_config, dist_envs[r])))
        sized = self._gather(Sized, START_TIMEOUT_S, "start")
        self.num_kv_blocks = min(m.n for m in sized)
        for c in self._conns:
            c.send(Blocks(self.num_kv_blocks))
        plans = [m.plan for m in self._gather(Ready, START_TIMEOUT_S, "start")]
        if len({_plan_key(p) for p in plans}) != 1:
            self._fail(f"ranks decided different platform plans ({sorted({_plan_key(p) for p in plans})})")
        self.plan = plans[0]
        try:  # every rank has mapped it: nothing to clean up if this process is killed later
            os.unlink(self._logits_path)
        except FileNotFoundError:
            pass

    def _gather(self, kind: type, timeout: float, what: str) -> list:
        """One message of `kind` (a channel message class) from every rank, in rank order. Raises WorkerFailure (after
        killing every worker) when a rank reports an error, exits, or is silent for `timeout` s."""
        got: dict[int, object] = {}
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
                    self._fail(f"{self._who(r)} {processes.status(p)} ({what})")
        return [got[r] for r in range(len(self._conns))]

    def _receive(self, c: Connection, r: int, kind: type, what: str):
        """Rank r's next message, which must be of `kind` (else WorkerFailure, as _gather)."""
        try:
            msg = c.recv()
        except (EOFError, OSError):
            p = self._procs[r]
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                pass
            self._fail(f"{self._who(r)} {processes.status(p)} ({what})")
        if isinstance(msg, Failed):
            self._fail(f"{self._dead_peer(r)}rank {r} ({self.devices[r]}) failed ({what}): {msg.text}")
        if not isinstance(msg, kind):
            self._fail(f"rank {r} sent {type(msg).__name__} instead of {kind.__name__} ({what})")
        return msg

    def _dead_peer(self, r: int, wait_s: float = 0.5) -> str:
        """"rank q (pid, device) killed by SIGKILL; then " for a rank other than r that a signal ended
        (waiting at most wait_s for one), else "". A rank whose collective failed because its peer
        was killed reports first as often as not (gloo: "Connection reset by peer"): the killed rank
        is the cause, so it is named first. A peer that exited by itself (after reporting its own
        error) is not; a remote rank whose connection closed is (how it ended is not known here)."""
        deadline = time.monotonic() + wait_s
        while True:
            for q, p in enumerate(self._procs):
                if q != r and p.poll() is not None and (p.returncode < 0 or isinstance(p, remote.RemoteRank)):
                    return f"{self._who(q)} {processes.status(p)}; then "
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
                return f"tensor-parallel worker {self._who(r)} {processes.status(p)}"
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
                c.send(RunStep(data))
            except OSError:
                pass  # the rank is gone: _gather names it
        for msg in self._gather(Done, STEP_TIMEOUT_S, "step"):
            if msg.columns is not None:  # a remote rank's logits columns
                start, end, part = msg.columns
                self._logits[:len(part), start:end] = part
        return np.array(self._logits[:rows])
