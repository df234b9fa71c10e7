"""A tensor-parallel worker process: `python -m paddle_llm_engine.executor.tp_worker <fd> <engine pid>`.

Started by TPExecutor (tensor_parallel.py) with one end of a socket pair on file descriptor <fd>
and the paddle.distributed environment of its rank (the collective backend the platform layer
names for its device: gloo on CPU; on GCU the plug-in's collectives through paddle's xccl
backend: ECCL on a GCU, tested here on the stand-in plug-in's shared-memory ones). It never
outlives the engine process (processes.watch_parent).
Lifecycle: "init" -> bind to the device, join the process group, build a Worker on the rank's
shard of the model (tp/: shard plan, sharded reader, tensor-parallel model) -> "sized" (the KV
blocks it can hold) -> "blocks" (the count every rank allocates) -> "ready" (its platform plan)
-> steps until "stop" or end of file. Any failure is sent as ("error", text) before the process
exits, so that the engine names it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import sys
import traceback
from multiprocessing.connection import Connection

from paddle_llm_engine.executor.channel import WorkerSpec, open_logits_file
from paddle_llm_engine.executor.processes import watch_parent

log = logging.getLogger("paddle_llm_engine.executor.tp_worker")


def build(spec: WorkerSpec):
    """Join the process group and build this rank's Worker (weights loaded, no KV cache yet)."""
    import paddle.distributed as dist

    from paddle_llm_engine.platforms import platform_for
    from paddle_llm_engine.tp.model import build_tp_model
    from paddle_llm_engine.tp.shard import ShardPlan
    from paddle_llm_engine.worker import Worker

    mc = spec.model_config
    shard = ShardPlan.make(spec.rank, spec.size, mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim,
                           mc.vocab_size)
    local = dataclasses.replace(mc, num_attention_heads=shard.num_heads, num_key_value_heads=shard.num_kv_heads)
    platform_for(spec.device).activate(spec.device, spec.threads)
    dist.init_parallel_env()
    worker = Worker(spec.engine_config, local, spec.device, threads=spec.threads, ranks_on_host=spec.size,
                    make_model=lambda cfg, ops, dtype: build_tp_model(cfg, ops, dtype, shard))
    return worker, shard


def serve(worker, shard, spec: WorkerSpec, conn: Connection) -> None:
    """Agree on the KV-cache size, then run steps until "stop" or the engine's end of file."""
    conn.send(("sized", worker.determine_num_kv_blocks()))
    msg = conn.recv()
    if msg[0] != "blocks":
        raise RuntimeError(f"expected the agreed KV block count, got {msg[0]!r}")
    worker.initialize_cache(msg[1])
    logits = open_logits_file(spec.logits_path, spec.logits_shape)
    conn.send(("ready", worker.plan))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        part = worker.execute(pickle.loads(msg[1]))
        if len(part):
            logits[:len(part), shard.vocab_start:shard.vocab_end] = part
        conn.send(("done",))


def main(argv: list[str]) -> int:
    """argv: [socket fd, engine pid]. Returns the exit code (0 after "stop", 1 on any failure)."""
    fd, parent = int(argv[0]), int(argv[1])
    watch_parent(parent)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tp-worker %(levelname)s %(name)s: %(message)s")
    conn = Connection(fd)
    try:
        spec = conn.recv()[1]
    except EOFError:
        return 1
    try:
        worker, shard = build(spec)
        serve(worker, shard, spec, conn)
    except (EOFError, BrokenPipeError):
        return 1  # the engine is gone
    except BaseException as e:
        log.error("tensor-parallel rank %d on %s failed:\n%s", spec.rank, spec.device, traceback.format_exc())
        try:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (paddle's process group destructors can hang)
