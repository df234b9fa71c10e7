"""A tensor-parallel worker process: `python -m paddle_llm_engine.tp.worker <fd> <parent pid>`.

Started by tp.runner with one end of a socket pair on file descriptor <fd> and the
paddle.distributed environment of its rank (gloo on CPU; on GCU the plug-in's collectives through
paddle's xccl backend, not run here). It never outlives the engine process: PR_SET_PDEATHSIG
(SIGKILL) from the thread that started it, a thread that exits when its parent pid changes, and the
socket's end of file when the engine is gone. Lifecycle: init (build the shard's runner: device,
platform plan, model shard, KV-cache size agreed with the other ranks, cache) -> "ready" -> steps
until "stop" or end of file. Any failure is sent as ("error", text) before the process exits,
so that the engine names it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

log = logging.getLogger("paddle_llm_engine.tp.worker")
PR_SET_PDEATHSIG = 1


def watch_parent(parent_pid: int) -> None:
    """Die with the engine process: PDEATHSIG now, and a thread polling the parent pid (for a
    parent thread that exits while its process lives on, or a kernel without prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(3)

    def poll():
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=poll, name="tp-parent-watch", daemon=True).start()


def _runner_class(device: str):
    from paddle_llm_engine.runner.cpu_runner import CPUModelRunner

    base = CPUModelRunner
    if device.startswith("gcu"):
        from paddle_llm_engine.runner.gcu_runner import GCUModelRunner

        base = GCUModelRunner

    class TPWorkerRunner(base):
        """The device's runner building rank `shard.rank`'s model and agreeing the KV-cache size
        with the other ranks (through the engine: every rank allocates the smallest count)."""

        def __init__(self, spec, shard, conn, model_config):
            self.spec, self.shard, self.conn = spec, shard, conn
            super().__init__(spec.engine_config, model_config, spec.device)

        def make_model(self):
            from paddle_llm_engine.tp.model import build_tp_model

            return build_tp_model(self.model_config, self.ops, self.plan.dtype, self.shard)

        def available_memory_bytes(self):
            avail = super().available_memory_bytes()
            if avail is not None and self.device == "cpu":  # every rank shares the host's memory
                avail //= self.spec.size
            return avail

        def _num_kv_blocks(self) -> int:
            self.conn.send(("sized", super()._num_kv_blocks()))
            msg = self.conn.recv()
            if msg[0] != "blocks":
                raise RuntimeError(f"expected the agreed KV block count, got {msg[0]!r}")
            return msg[1]

    return TPWorkerRunner


def build(spec, conn):
    """Join the process group and build this rank's runner."""
    import paddle
    import paddle.distributed as dist

    from paddle_llm_engine.tp.shard import ShardPlan

    mc = spec.model_config
    shard = ShardPlan.make(spec.rank, spec.size, mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim,
                           mc.vocab_size)
    local = dataclasses.replace(mc, num_attention_heads=shard.num_heads, num_key_value_heads=shard.num_kv_heads)
    paddle.set_device(spec.device if spec.device != "cpu" else "cpu")
    dist.init_parallel_env()
    return _runner_class(spec.device)(spec, shard, conn, local)


def serve(runner, spec, conn) -> None:
    """Run steps until "stop" or the engine's end of file."""
    import paddle

    from paddle_llm_engine.tp.channel import from_wire, open_logits_file
    from paddle_llm_ops import gather_last_tokens

    logits = open_logits_file(spec.logits_path, spec.logits_shape)
    v0, v1 = runner.shard.vocab_start, runner.shard.vocab_end
    conn.send(("ready", runner.ops.decode_metadata))
    with paddle.no_grad():
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg[0] == "stop":
                return
            copies, wire, last_rows = pickle.loads(msg[1])
            if copies:
                runner.copy_blocks(copies)
            input_ids, positions, meta = from_wire(wire)
            hidden = runner.model.forward(input_ids, positions, meta, runner.kv_caches)
            if len(last_rows):
                part = runner.model.compute_logits(gather_last_tokens(hidden, paddle.to_tensor(last_rows)))
                logits[:len(last_rows), v0:v1] = part.numpy()
            conn.send(("done",))


def main(argv: list[str]) -> int:
    fd, parent = int(argv[0]), int(argv[1])
    watch_parent(parent)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tp-worker %(levelname)s %(name)s: %(message)s")
    conn = Connection(fd)
    try:
        msg = conn.recv()
    except EOFError:
        return 1
    spec = msg[1]
    try:
        runner = build(spec, conn)
        serve(runner, spec, conn)
    except (EOFError, BrokenPipeError):
        return 1  # the engine is gone
    except BaseException as e:
        text = f"{type(e).__name__}: {e}"
        log.error("tensor-parallel rank %d on %s failed:\n%s", spec.rank, spec.device, traceback.format_exc())
        try:
            conn.send(("error", text))
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (paddle's process group destructors can hang)
