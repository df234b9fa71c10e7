"""Peer half of benchmarks/compare.py: llama.cpp's own server (PyPI wheel xllamacpp), run in the peer venv.

    build/peer-venv/bin/python benchmarks/llamacpp_peer.py --model X.gguf [--threads 2] [--parallel 32]
        [--ctx-per-slot 512] [--max-seconds 3600]

`xllamacpp.Server(params)` loads the GGUF and starts llama.cpp's C++ HTTP server in this process
(continuous batching over --parallel slots, one KV stream per slot, --ctx-per-slot tokens each), bound
to 127.0.0.1 on a port the OS picks. Once /health answers, one JSON line goes to stdout:
    {"address": "http://127.0.0.1:PORT", "xllamacpp": version, "load_s": seconds}
The server then runs until stdin reaches EOF (the parent closes it or dies) or --max-seconds have
passed, whichever comes first; then the process exits. Threads: --threads for generation and for
prompt processing (cpuparams and cpuparams_batch), set explicitly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request


def wait_health(address: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(address + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"llama.cpp server at {address} not healthy after {timeout:.0f} s")
        time.sleep(0.1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=32)
    ap.add_argument("--ctx-per-slot", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2048, help="n_batch: tokens per llama_decode")
    ap.add_argument("--max-seconds", type=float, default=3600.0)
    args = ap.parse_args(argv)

    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = args.model
    p.n_parallel = args.parallel
    p.n_ctx = args.parallel * args.ctx_per_slot
    p.n_batch = args.batch
    p.cont_batching = True
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.n_gpu_layers = 0
    p.hostnames = ["127.0.0.1"]
    p.port = 0
    p.warmup = True
    t0 = time.monotonic()
    server = xlc.Server(p)
    address = server.listening_address
    wait_health(address, 120.0)
    print(json.dumps({"address": address, "xllamacpp": xlc.__version__, "load_s": time.monotonic() - t0}),
          flush=True)

    done = threading.Event()

    def watch_stdin():
        try:
            sys.stdin.read()
        finally:
            done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    done.wait(args.max_seconds)
    sys.stdout.flush()
    os._exit(0)  # the server's threads are native; leave without waiting on their teardown


if __name__ == "__main__":
    sys.exit(main())
