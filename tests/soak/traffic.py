"""Mixed client traffic: N client threads, each sending one request at a time drawn from a weighted
mix of request kinds on both models and both protocols, plus one light client on the TP model.
`Traffic.pause()` (bounded) lets the in-flight requests end and holds new ones, for the flood and
the drain; `stop()` ends it. Every request records an Outcome (records.py)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
import time
from functools import partial

import bad_inputs
import grpc_requests as G
import http_requests as H
import llmapi_requests as L
import openai_requests as O
from checks import UNREACHABLE as _UNREACHABLE
from records import Outcome, Recorder


@dataclasses.dataclass
class Kind:
    """A request kind of the mix: its weight and the models it is sent to (None: the kind picks)."""
    name: str
    weight: float
    run: object  # (ctx, client, rng, model) -> Outcome
    models: tuple


def mix(name: str = "full") -> list[Kind]:
    """The request kinds and their weights. "short" keeps every kind (all pass criteria apply) but
    sends fewer long guided requests, for the 3-minute run on a busy 2-core host."""
    both = ("ensemble", "llm")
    kinds = [
        Kind("grpc_stream", 6, G.complete, both),
        Kind("grpc_nonstream", 2, partial(G.complete, stream=False), both),
        Kind("grpc_cancel_mid", 3, G.cancel_mid, both),
        Kind("grpc_cancel_before_first", 2, G.cancel_before_first, both),
        Kind("grpc_drop_mid", 1.5, G.drop_mid, both),
        Kind("grpc_stop_input", 3, G.trtllm_stop, ("ensemble",)),
        Kind("grpc_stop_input_llm", 0.5, G.trtllm_stop, ("llm",)),
        Kind("http_generate", 2, H.generate, both),
        Kind("http_stream", 2, H.stream, both),
        Kind("http_stream_close", 2, H.close_mid, both),
        Kind("http_socket_reset", 1, H.socket_reset, both),
        Kind("grpc_bad_input", 1.5, bad_inputs.grpc_bad, (None,)),
        Kind("http_bad_input", 1, bad_inputs.http_bad, (None,)),
        Kind("grpc_n2", 1.5, partial(G.complete, n=2), ("ensemble",)),
        Kind("grpc_guided", 1.5, partial(G.complete, guided=True), both),
        # TensorRT-LLM's llmapi model (tensorrt_llm) on the same engine
        Kind("llmapi_unary", 1.5, L.unary, ("tensorrt_llm",)),
        Kind("llmapi_stop", 0.5, L.stop, ("tensorrt_llm",)),
        Kind("http_guided", 0.5, partial(H.generate, guided=True), both),
        # the OpenAI frontend beside Triton (behind an API key) and who may call what
        Kind("openai_chat", 2, O.chat, ("llm",)),
        Kind("openai_json", 1, O.json_schema, ("llm",)),
        Kind("openai_tool", 0.7, O.tool, ("llm",)),
        Kind("openai_stream_close", 0.7, O.close_mid, ("llm",)),
        Kind("openai_bad_input", 0.3, O.bad, ("llm",)),
        Kind("openai_unauthorized", 0.3, O.unauthorized, ("llm",)),
        Kind("admin_api_refused", 0.3, O.admin, ("llm",)),
    ]
    if name == "short":
        for k in kinds:
            if "guided" in k.name or k.name in ("openai_json", "openai_tool"):
                k.weight /= 2
    elif name != "full":
        raise ValueError(f"unknown mix {name!r} (full, short)")
    return kinds


class Context:
    """What request functions need: the current endpoints (they change when the soak restarts a
    dead server), the bounds, and unique request ids."""

    def __init__(self, stall_s: float, timeout_s: float):
        self.stall_s = stall_s      # no response for this long = stalled
        self.timeout_s = timeout_s  # whole-request bound
        self._ids = itertools.count()
        self._urls = ("", "", "")
        self._lock = threading.Lock()

    def set_endpoints(self, grpc_url: str, http_base: str, openai_base: str = "") -> None:
        """Point every later request at a (new) server."""
        with self._lock:
            self._urls = (grpc_url, http_base, openai_base)

    def openai_base(self) -> str:
        """http://host:port of the current server's OpenAI frontend."""
        return self._urls[2]

    def grpc_url(self) -> str:
        """host:port of the current server's gRPC endpoint."""
        return self._urls[0]

    def http_base(self) -> str:
        """http://host:port of the current server's HTTP endpoint."""
        return self._urls[1]

    def new_id(self) -> str:
        """A request id unique within the soak (soak-N)."""
        return f"soak-{next(self._ids)}"


class Traffic:
    """The client threads. clients: concurrent clients on the main models; tp_model: a model for
    the light extra client (None: none)."""

    def __init__(self, ctx: Context, recorder: Recorder, clients: int, kinds: list[Kind], seed: int,
                 tp_model: str | None = None, tp_period_s: float = 4.0):
        self.ctx, self.recorder, self.kinds = ctx, recorder, kinds
        self._stop = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._busy: dict[str, bool] = {}
        self.stalls_seen = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(f"c{i}", random.Random(seed * 1000 + i)),
                                         name=f"soak-client-{i}", daemon=True) for i in range(clients)]
        if tp_model:
            self.threads.append(threading.Thread(target=self._tp_client, args=(tp_model, random.Random(seed), tp_period_s),
                                                 name="soak-client-tp", daemon=True))

    def start(self) -> None:
        """Start the client threads."""
        for t in self.threads:
            t.start()

    def _set_busy(self, name: str, busy: bool) -> None:
        with self._lock:
            self._busy[name] = busy

    def _wait_go(self, name: str) -> bool:
        """Block while held; True once `name` may send (it is then marked busy), False when stopping.
        Checking the go flag and marking busy under one lock is what lets pause() see every client
        that got past the flag: a client cannot start a request after pause() counted none in flight."""
        while not self._stop.is_set():
            if not self._go.wait(timeout=0.5):
                continue
            with self._lock:
                if self._stop.is_set():
                    return False
                if self._go.is_set():
                    self._busy[name] = True
                    return True
        return False

    def _run(self, name: str, fn, rng, model) -> None:
        """Run one request of `name` (marked busy by _wait_go) and record its outcome."""
        try:
            out = fn(self.ctx, name, rng, model)
        except Exception as e:  # noqa: BLE001 - a bug in a request kind must not end the client
            out = Outcome(getattr(fn, "__name__", "request"), str(model), "?", name, "-", t_send=time.monotonic(),
                          t_end=time.monotonic(), status="error", error=f"soak client error: {type(e).__name__}: {e}")
            out.problems.append("soak client raised")
        finally:
            self._set_busy(name, False)
        self.recorder.add(out)
        if out.status in ("stall", "malformed"):
            self.stalls_seen += 1
            if self.stalls_seen <= 10:  # say it as it happens (the soak may run for hours)
                self.recorder.event("note", f"{out.status} request {out.request_id} ({out.scenario} "
                                            f"{out.model}/{out.protocol}): {(out.error or '; '.join(out.problems))[:200]}")
        return out

    def _client(self, name: str, rng: random.Random) -> None:
        weights = [k.weight for k in self.kinds]
        while self._wait_go(name):
            kind = rng.choices(self.kinds, weights)[0]
            model = rng.choice(kind.models)
            out = self._run(name, kind.run, rng, model)
            # an unreachable server fails every request at once: do not spin on it
            pause = 1.0 if out.status == "error" and _UNREACHABLE.search(out.error or "") else rng.uniform(0.0, 0.2)
            self._stop.wait(pause)

    def _tp_client(self, model: str, rng: random.Random, period: float) -> None:
        while self._wait_go("tp"):
            fn = G.cancel_mid if rng.random() < 0.25 else G.complete
            self._run("tp", fn, rng, model)
            self._stop.wait(rng.uniform(0.5, 1.5) * period)

    def in_flight(self) -> int:
        """How many clients are inside a request now."""
        with self._lock:
            return sum(self._busy.values())

    def pause(self, timeout: float) -> bool:
        """Hold new requests and wait up to timeout seconds for those in flight; True if none left."""
        with self._lock:
            self._go.clear()
        deadline = time.monotonic() + timeout
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.in_flight() == 0

    def hold(self) -> None:
        """Hold new requests without waiting for those in flight."""
        with self._lock:
            self._go.clear()

    def resume(self) -> None:
        """Let the clients send again after pause() / hold()."""
        self._go.set()

    def stop(self, timeout: float) -> bool:
        """End the clients (requests in flight finish or time out); True if all threads ended."""
        self._stop.set()
        self._go.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(deadline - time.monotonic(), 0.0))
        return not any(t.is_alive() for t in self.threads)
