"""A tensor-parallel worker process: `python -m paddle_llm_engine.executor.tp_worker <fd> <engine pid>`,
or on another host (EngineConfig.tp_hosts):
`python -m paddle_llm_engine.executor.tp_worker --connect <engine address>:<tp_port> --rank <r>
[--wait <s>] [--forever]` with the shared token in PADDLE_LLM_TP_TOKEN (or PADDLE_LLM_TP_TOKEN_FILE).

Started by TPExecutor (tensor_parallel.py) with one end of a socket pair on file descriptor <fd>
and the paddle.distributed environment of its rank (the collective backend the platform layer
names for its device: gloo on CPU; on GCU the plug-in's collectives through paddle's xccl
backend: ECCL on a GCU, tested here on the stand-in plug-in's shared-memory ones). It never
outlives the engine process (processes.watch_parent).
Lifecycle (messages of channel.py): Init -> bind to the device, join the process group, build a
Worker on the rank's shard of the model (tp/: shard plan, sharded reader, tensor-parallel model) ->
Sized (the KV blocks it can hold) -> Blocks (the count every rank allocates) -> Ready (its platform
plan) -> RunStep / Done until Stop or end of file. Any failure is sent as Failed(text) before the
process exits, so that the engine names it.

Remote mode: connect (retrying for --wait s, default 600, so either side may start first),
authenticate both ways (remote.py), say Hello(rank, host name, pid), take the distributed
environment from Init (GLOO_SOCKET_IFNAME: the operator's value, else the interface of the
address this connection leaves from), then as above, the logits columns going back with Done.
It exits when the engine's connection closes (a watcher thread, also while a collective blocks),
so it never outlives the engine. --forever runs one such worker after another (a per-host agent:
the engine reloads after a failure and waits for its ranks again).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from paddle_llm_engine.executor.channel import (Blocks, Done, Failed, Hello, Init, Ready, Reject, Sized, Stop,
                                                WorkerSpec, open_logits_file)
from paddle_llm_engine.executor import remote
from paddle_llm_engine.executor.processes import watch_parent
from paddle_llm_engine.platforms.interpreter import python_executable

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
    worker = Worker(spec.engine_config, local, spec.device, threads=spec.threads,
                    ranks_on_host=spec.ranks_on_host or spec.size,
                    make_model=lambda cfg, ops, dtype: build_tp_model(cfg, ops, dtype, shard))
    return worker, shard


def serve(worker, shard, spec: WorkerSpec, conn: Connection) -> None:
    """Agree on the KV-cache size, then run steps until Stop or the engine's end of file."""
    conn.send(Sized(worker.determine_num_kv_blocks()))
    msg = conn.recv()
    if not isinstance(msg, Blocks):
        raise RuntimeError(f"expected the agreed KV block count, got {type(msg).__name__}")
    worker.initialize_cache(msg.n)
    logits = open_logits_file(spec.logits_path, spec.logits_shape) if spec.logits_path else None
    conn.send(Ready(worker.plan))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if isinstance(msg, Stop):
            return
        part = worker.execute(pickle.loads(msg.data))
        if logits is None:  # a remote rank: its columns go back over the connection
            conn.send(Done((shard.vocab_start, shard.vocab_end, part)))
            continue
        if len(part):
            logits[:len(part), shard.vocab_start:shard.vocab_end] = part
        conn.send(Done())


def main(argv: list[str]) -> int:
    """argv: [socket fd, engine pid], or the remote options (remote_main). Returns the exit code (0
    after Stop, 1 on any failure)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tp-worker %(levelname)s %(name)s: %(message)s")
    if argv and argv[0].startswith("--"):
        return remote_main(argv)
    fd, parent = int(argv[0]), int(argv[1])
    watch_parent(parent)
    conn = Connection(fd)
    try:
        msg = conn.recv()
    except EOFError:
        return 1
    if not isinstance(msg, Init):  # Stop: the start failed elsewhere (e.g. a remote rank never joined)
        return 0
    return run(msg.spec, conn)


def run(spec: WorkerSpec, conn: Connection) -> int:
    """Build and serve rank spec.rank over `conn`; the exit code (0 after Stop, 1 on a failure,
    which is sent as Failed(text) first)."""
    try:
        worker, shard = build(spec)
        serve(worker, shard, spec, conn)
    except (EOFError, BrokenPipeError):
        return 1  # the engine is gone
    except BaseException as e:
        log.error("tensor-parallel rank %d on %s failed:\n%s", spec.rank, spec.device, traceback.format_exc())
        try:
            conn.send(Failed(f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        return 1
    return 0



def _arguments(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m paddle_llm_engine.executor.tp_worker",
                                description="A tensor-parallel rank on another host (EngineConfig.tp_hosts); "
                                            "the shared token comes from PADDLE_LLM_TP_TOKEN or PADDLE_LLM_TP_TOKEN_FILE.")
    p.add_argument("--connect", required=True, help="the engine's address:port (first tp_hosts entry, tp_port)")
    p.add_argument("--rank", type=int, required=True, help="this process's rank (tp_hosts order)")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to keep trying to connect (default 600)")
    p.add_argument("--forever", action="store_true", help="serve one engine after another (a per-host agent)")
    return p.parse_args(argv)


def connect(address: str, rank: int, wait_s: float, token: bytes) -> tuple[Connection, WorkerSpec]:
    """Connect to the engine at "host:port" (retrying for wait_s), authenticate, say hello and
    return the connection and this rank's WorkerSpec. Raises ConnectionError when the engine
    cannot be reached in time or rejects the rank, AuthenticationError on a token mismatch."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=5.0)
            break
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"cannot reach the engine at {address} within {wait_s:g} s: {e}") from None
            time.sleep(1.0)
    local_address = sock.getsockname()[0]
    conn = remote.authenticate(sock, token, engine_side=False)
    conn.send(Hello(rank, socket.gethostname(), os.getpid()))
    msg = conn.recv()
    if isinstance(msg, Reject):
        raise ConnectionError(f"the engine at {address} rejected rank {rank}: {msg.reason}")
    spec = msg.spec
    env = dict(spec.env)
    if "GLOO_SOCKET_IFNAME" in os.environ:
        env.pop("GLOO_SOCKET_IFNAME", None)
    elif remote.interface_of(local_address):
        env["GLOO_SOCKET_IFNAME"] = remote.interface_of(local_address)
    os.environ.update(env)  # before paddle.distributed reads it (build)
    if not spec.threads:  # the engine does not know this host's cores
        from paddle_llm_engine.platforms import platform_for

        spec.threads = platform_for(spec.device).kernel_threads(0, spec.ranks_on_host)
    return conn, spec


def watch_engine(conn: Connection) -> None:
    """Exit this process when the engine's end of `conn` closes or resets, also while the main
    thread is blocked in a collective (the engine killed its local ranks: this one would hang)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLRDHUP | select.POLLHUP | select.POLLERR)

    def loop():
        while True:
            if poller.poll(1000):
                log.error("the engine's connection closed: exiting")
                os._exit(3)

    threading.Thread(target=loop, name="tp-engine-watch", daemon=True).start()


def remote_main(argv: list[str]) -> int:
    """The remote worker (see the module docstring). Returns the exit code: 0 after Stop, 1 on a
    failure, 2 when the engine cannot be reached or refuses this rank."""
    args = _arguments(argv)
    token = remote.load_token()
    if args.forever:
        cmd = [python_executable(), "-m", "paddle_llm_engine.executor.tp_worker", "--connect", args.connect,
               "--rank", str(args.rank), "--wait", str(args.wait)]
        while True:
            code = subprocess.call(cmd)
            log.info("rank %d: worker exited with %d; waiting for the engine again", args.rank, code)
            time.sleep(2.0)
    try:
        conn, spec = connect(args.connect, args.rank, args.wait, token)
    except (ConnectionError, OSError, EOFError) as e:
        log.error("rank %d: %s", args.rank, e)
        return 2
    watch_engine(conn)
    return run(spec, conn)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (paddle's process group destructors can hang)
