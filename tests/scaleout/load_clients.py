"""The scale-out test's clients, in a process of their own: mixed requests through a load balancer.

    load_clients.py --http-base http://127.0.0.1:P --grpc-url 127.0.0.1:Q --out records.jsonl
        [--clients 4] [--max-tokens 16] [--burst 12] [--request-timeout 120]

--clients threads send one request at a time each, KINDS in turn (offset per client): gRPC streams to
`llm` and `ensemble` (tritonclient), HTTP generate and generate_stream to both (Triton's generate
extension). SIGUSR1 sends --burst more requests at once (gRPC and HTTP alternating: BURST_KINDS), from
threads started and waiting since the start, once.
SIGTERM: no new request; the ones in flight finish, then exit 0 (1 if one has not finished within
--request-timeout + 10 s). Every request appends one JSON line to --out when it ends: kind, burst
(whether it was one of the burst), start (epoch s), seconds, failure (None when it ended normally with all --max-tokens tokens, else what the
client saw). "started" on stdout once the clients run.

Why a process: the test forks replica launchers while this load runs, and a process with gRPC calls
in flight must not fork (grpcio: "Other threads are currently calling into gRPC, skipping fork()
handlers", and the child then aborted in epoll_wait with "Bad file descriptor" once in three runs).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # own process: clients, http_clients
from clients import GrpcStream, ensemble_inputs, llm_inputs  # noqa: E402
from http_clients import http_generate, http_generate_stream  # noqa: E402

KINDS = ("grpc_llm", "grpc_ensemble", "http_generate_llm", "http_stream_ensemble", "http_stream_llm",
         "http_generate_ensemble")
BURST_KINDS = ("grpc_llm", "http_stream_llm", "grpc_ensemble", "http_generate_ensemble")


class Clients:
    """The client threads and their records (see the module doc)."""

    def __init__(self, args):
        self.args = args
        self.llm_params = {"temperature": 0, "max_tokens": args.max_tokens, "ignore_eos": True}
        self._out = open(args.out, "a")
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(c,), name=f"client-{c}", daemon=True)
                        for c in range(args.clients)]
        for t in self.threads:
            t.start()

    def _client(self, c: int) -> None:
        i = 0
        while not self.stop.is_set():
            self._one(KINDS[(c + i) % len(KINDS)], f"Client {c} request {i}: tell me about the sea.")
            i += 1

    def arm_burst(self) -> None:
        """Start the --burst threads now, each waiting to send: burst() then only releases them, so
        the requests go out within milliseconds even when this process is starved of CPU (thread start
        and client set-up can take seconds on a loaded 2-core host, longer than HAProxy's checks)."""
        self._go = threading.Event()
        for j in range(self.args.burst):
            t = threading.Thread(target=self._armed, args=(BURST_KINDS[j % len(BURST_KINDS)], f"Burst {j}: name a fish."),
                                 name=f"burst-{j}", daemon=True)
            self.threads.append(t)
            t.start()

    def _armed(self, kind: str, text: str) -> None:
        self._go.wait()
        if not self.stop.is_set():
            self._one(kind, text, burst=True)

    def burst(self) -> None:
        self._go.set()

    def _one(self, kind: str, text: str, burst: bool = False) -> None:
        t0, m0 = time.time(), time.monotonic()
        try:
            failure = self.request(kind, text)
        except Exception as e:  # noqa: BLE001 - any exception is a client-visible failure
            failure = f"{type(e).__name__}: {e}"
        line = json.dumps({"kind": kind, "burst": burst, "start": t0, "seconds": time.monotonic() - m0,
                           "failure": failure})
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()

    def request(self, kind: str, text: str) -> str | None:
        """One request of `kind`; None when it ended normally with max_tokens tokens, else what was wrong."""
        n = self.args.max_tokens
        if kind.startswith("grpc"):
            return self._grpc(kind[5:], text, n)
        model = "llm" if kind.endswith("llm") else "ensemble"
        stream = "stream" in kind
        if model == "llm":
            payload = {"text_input": text, "stream": stream, "sampling_parameters": json.dumps(self.llm_params),
                       "return_num_output_tokens": True}
        else:
            payload = {"text_input": text, "max_tokens": n, "min_tokens": n, "temperature": 0.0, "stream": stream}
        call = http_generate_stream if stream else http_generate
        h = call(self.args.http_base, model, payload, timeout=self.args.request_timeout)
        if h.status != 200 or h.error:
            return f"HTTP {h.status}: {h.error}"
        parts = h.events if stream else [h.body]
        if model == "llm":  # num_output_tokens: the tokens of each response
            tokens = sum(int(p.get("num_output_tokens", 0)) for p in parts)
        else:  # output_log_probs: one entry per token
            tokens = sum(len(p["output_log_probs"]) if isinstance(p["output_log_probs"], list) else 1
                         for p in parts if "output_log_probs" in p)
        if not h.text:
            return "empty text"
        return None if tokens == n else f"{tokens} tokens, not {n}"

    def _grpc(self, model: str, text: str, n: int) -> str | None:
        if model == "llm":
            inputs = llm_inputs(text, True, self.llm_params, return_num_output_tokens=True)
        else:
            inputs = ensemble_inputs(text, max_tokens=n, min_tokens=n, temperature=0.0, stream=True)
        r = GrpcStream(self.args.grpc_url, model, inputs, timeout=self.args.request_timeout).collect()
        if r.error is not None or not r.final_seen:
            return f"{r.error or 'no final response'} after {len(r.responses)} responses"
        tokens = (sum(int(a.reshape(-1)[0]) for a in r.all("num_output_tokens")) if model == "llm"
                  else sum(a.size for a in r.all("output_log_probs")))
        return None if tokens == n else f"{tokens} tokens, not {n}"

    def finish(self) -> bool:
        """Wait for every request in flight (bounded); True when all ended."""
        deadline = time.monotonic() + self.args.request_timeout + 10
        for t in list(self.threads):
            t.join(max(0.0, deadline - time.monotonic()))
        self._out.close()
        return not any(t.is_alive() for t in self.threads)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--http-base", required=True)
    ap.add_argument("--grpc-url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--burst", type=int, default=12)
    ap.add_argument("--request-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    bursts: list[int] = []
    stopping: list[int] = []
    # The handlers only append to a list: a handler runs on the main thread between bytecodes, and an
    # Event.set() there can find the Event's lock held by that same thread inside Event.wait() (a
    # self-deadlock, seen once: the clients kept sending for 140 s after the SIGTERM).
    signal.signal(signal.SIGUSR1, lambda *_: bursts.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    clients = Clients(args)
    clients.arm_burst()
    print("started", flush=True)
    while not stopping:
        time.sleep(0.02)  # interrupted by a signal, whose handler runs at once
        while bursts:
            bursts.pop()
            clients.burst()
    clients.stop.set()
    clients.burst()  # an armed burst never released: its threads see stop and end
    return 0 if clients.finish() else 1


if __name__ == "__main__":
    sys.exit(main())
