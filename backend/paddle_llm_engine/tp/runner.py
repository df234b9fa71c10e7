"""The engine-side runner of a tensor-parallel engine: starts one worker process per device, sends
each step to every rank, waits for all of them, and samples once from the logits rows the ranks
assembled in shared memory (ModelRunnerBase.sample_step). The engine process loads no weights.

Workers are watched on every wait: a worker that exits (crash, SIGKILL, a failed step) makes the
step raise RuntimeError naming its rank, pid and exit status, after the other ranks (then stuck
in a collective) are killed; the engine loop fails the requests in flight with it, as for any
engine failure. Start-up waits the same way, so a worker that fails to load fails the start with
its own error, and no worker is left behind. close() (LLMEngine.close, also at interpreter exit)
stops them: "stop", then SIGKILL after STOP_GRACE_S.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import weakref
from multiprocessing.connection import Connection, wait

import numpy as np

from paddle_llm_engine.runner.base import ModelRunnerBase, StepResult
from paddle_llm_engine.tp.channel import WorkerSpec, create_logits_file, to_wire
from paddle_llm_engine.tp.shard import check_devices, check_tensor_parallel

log = logging.getLogger(__name__)

START_TIMEOUT_S = 900.0  # importing paddle and loading a shard, on a busy host
STEP_TIMEOUT_S = 900.0   # a step on which no rank answers for this long is a hung worker
STOP_GRACE_S = 5.0


class WorkerFailure(RuntimeError):
    """A tensor-parallel worker died, reported an error, or stopped answering."""


def _python() -> str:
    """The interpreter for the workers: this one, unless this process is an embedding binary
    (Triton's Python-backend stub), then the `python3` its PATH finds (the venv's)."""
    exe = sys.executable or ""
    if os.path.basename(exe).startswith("python"):
        return exe
    for cand in (os.path.join(sys.prefix, "bin", "python3"), shutil.which("python3")):
        if cand and os.path.isfile(cand):
            return cand
    raise RuntimeError(f"no Python interpreter found for the tensor-parallel workers (sys.executable {exe!r})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(proc: subprocess.Popen) -> str:
    code = proc.poll()
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _stop_workers(procs: list, conns: list, logits_path: str | None) -> None:
    """Stop every worker (used by close() and as the finalizer): "stop", grace, SIGKILL."""
    for c in conns:
        try:
            c.send(("stop",))
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            try:
                p.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
    for c in conns:
        try:
            c.close()
        except OSError:
            pass
    if logits_path:
        try:
            os.unlink(logits_path)
        except FileNotFoundError:
            pass
    procs.clear()
    conns.clear()


class TPModelRunner(ModelRunnerBase):
    """ModelRunnerBase's step interface over `tensor_parallel_size` worker processes.

    Raises ValueError at start for a tensor_parallel_size the model's heads or the devices do not
    allow (naming both numbers), WorkerFailure when a worker fails to start."""

    def __init__(self, engine_config, model_config, device: str):
        import paddle

        self.config = engine_config
        self.model_config = model_config
        self.block_size = engine_config.block_size
        self.size = n = engine_config.tensor_parallel_size
        check_tensor_parallel(n, model_config.num_attention_heads, model_config.num_key_value_heads)
        first = int(device.partition(":")[2] or 0) if device != "cpu" else 0
        self.devices = check_devices(n, device, first)
        self.device = device
        paddle.set_device("cpu")  # this process only packs step metadata and samples
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        self._step_msg_bytes = 0
        rows = engine_config.max_num_seqs
        self._logits_path, self._logits = create_logits_file(rows, model_config.vocab_size)
        self._finalizer = weakref.finalize(self, _stop_workers, self._procs, self._conns, self._logits_path)
        t0 = time.monotonic()
        try:
            self._start(engine_config, model_config)
        except BaseException:
            self.close()
            raise
        log.info("tensor parallel: %d workers on %s ready in %.1f s (pids %s), %d KV blocks per rank",
                 n, ", ".join(self.devices), time.monotonic() - t0, [p.pid for p in self._procs], self.num_kv_blocks)

    # -- processes -------------------------------------------------------------------------------
    def _start(self, engine_config, model_config) -> None:
        n = self.size
        threads = engine_config.num_threads or max(1, (os.cpu_count() or 1) // n)
        worker_config = dataclasses.replace(engine_config, num_threads=threads)
        port = _free_port()
        ends = ",".join(f"127.0.0.1:{port + r}" for r in range(n))
        base_env = dict(os.environ)
        base_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        pairs = [socket.socketpair() for _ in range(n)]
        specs = []
        envs = []
        for r in range(n):
            env = dict(base_env, PADDLE_TRAINER_ID=str(r), PADDLE_TRAINERS_NUM=str(n), PADDLE_TRAINER_ENDPOINTS=ends,
                       PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{port + r}", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), PADDLE_RANK_IN_NODE=str(r), PADDLE_LOCAL_SIZE=str(n))
            dev = self.devices[r]
            if dev == "cpu":
                env["PADDLE_DISTRI_BACKEND"] = "gloo"
            else:  # the plug-in's collective library through paddle's custom-device backend (untested here)
                kind, _, did = dev.partition(":")
                env.update(PADDLE_DISTRI_BACKEND="xccl", PADDLE_XCCL_BACKEND=kind, **{f"FLAGS_selected_{kind}s": did})
            envs.append(env)
            specs.append(WorkerSpec(r, n, dev, worker_config, model_config, self._logits_path,
                                    tuple(self._logits.shape)))
        python = _python()
        ready = threading.Event()
        failure: list[BaseException] = []

        def keeper():
            # The workers' PR_SET_PDEATHSIG fires when the thread that started them exits: this
            # thread lives as long as they do.
            try:
                for r, (_, child) in enumerate(pairs):
                    fd = child.fileno()
                    self._procs.append(subprocess.Popen(
                        [python, "-m", "paddle_llm_engine.tp.worker", str(fd), str(os.getpid())],
                        env=envs[r], pass_fds=(fd,), stdin=subprocess.DEVNULL))
            except BaseException as e:
                failure.append(e)
            finally:
                for _, child in pairs:
                    child.close()
                ready.set()
            for p in list(self._procs):
                p.wait()

        threading.Thread(target=keeper, name="tp-workers", daemon=True).start()
        ready.wait()
        for parent, _ in pairs:
            self._conns.append(Connection(parent.detach()))
        if failure:
            raise WorkerFailure(f"cannot start the tensor-parallel workers: {failure[0]}")
        for c, spec in zip(self._conns, specs):
            c.send(("init", spec))
        sized = self._gather("sized", START_TIMEOUT_S, "start")
        self.num_kv_blocks = min(m[1] for m in sized)
        for c in self._conns:
            c.send(("blocks", self.num_kv_blocks))
        ready = self._gather("ready", START_TIMEOUT_S, "start")
        forms = {msg[1] for msg in ready}
        if len(forms) != 1:
            self._fail(f"ranks chose different decode kernels ({sorted(forms)})")
        # prepare() (in this process) packs the decode metadata in the form the workers' kernels read
        self.ops = types.SimpleNamespace(decode_metadata=forms.pop())
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
                r = pending[c]
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    p = self._procs[r]
                    try:
                        p.wait(2.0)
                    except subprocess.TimeoutExpired:
                        pass
                    self._fail(f"rank {r} (pid {p.pid}, {self.devices[r]}) {_status(p)} ({what})")
                if msg[0] == "error":
                    self._fail(f"rank {r} ({self.devices[r]}) failed ({what}): {msg[1]}")
                if msg[0] != kind:
                    self._fail(f"rank {r} sent {msg[0]!r} instead of {kind!r} ({what})")
                got[r] = msg
                del pending[c]
            for c, r in list(pending.items()):  # a worker can die without its socket closing yet
                p = self._procs[r]
                if p.poll() is not None and not c.poll():
                    self._fail(f"rank {r} (pid {p.pid}, {self.devices[r]}) {_status(p)} ({what})")
        return [got[r] for r in range(len(self._conns))]

    def _fail(self, reason: str):
        self.error = reason
        self.close()
        raise WorkerFailure(f"tensor-parallel worker {reason}")

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        self._finalizer()

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- one step --------------------------------------------------------------------------------
    def execute(self, scheduled, return_logits: bool = False, copies=()) -> StepResult:
        if not self._conns:
            raise WorkerFailure(f"the tensor-parallel workers are stopped ({getattr(self, 'error', 'closed')})")
        sampled, input_ids, positions, meta, last_rows = self.prepare(scheduled)
        if len(last_rows) > self._logits.shape[0]:
            raise RuntimeError(f"{len(last_rows)} rows to sample exceed the logits buffer's {self._logits.shape[0]}")
        data = pickle.dumps((list(copies), to_wire((input_ids, positions, meta)), last_rows),
                            protocol=pickle.HIGHEST_PROTOCOL)
        self._step_msg_bytes = len(data)
        for c in self._conns:
            try:
                c.send(("step", data))
            except OSError:
                pass  # the rank is gone: _gather names it
        self._gather("done", STEP_TIMEOUT_S, "step")
        if len(last_rows) == 0:
            return StepResult([], np.empty(0, dtype=np.int64), [])
        return self.sample_step(sampled, np.array(self._logits[:len(last_rows)]), return_logits)
