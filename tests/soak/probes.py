"""Health probes: one tiny request (max_tokens 1, gRPC stream) per model every few seconds, on its
own thread per model, bounded by a time-out. A probe answers "is this model serving?" from the
outside, which is all a load balancer (or a person) can know."""

from __future__ import annotations

import dataclasses
import threading
import time

from clients import ensemble_inputs, llm_inputs  # tests/support
from llmapi_requests import _inputs as llmapi_inputs
from streams import Stream, StreamTimeout, final

BUSY_WORDS = ("max_num_waiting", "max_waiting_requests")  # a refusal at the waiting limit: alive


@dataclasses.dataclass
class Probe:
    """One probe: when it was sent and answered (monotonic seconds), whether the model served, the error."""
    model: str
    t_sent: float
    t_done: float
    ok: bool
    message: str = ""


def probe_once(grpc_url: str, model: str, timeout: float) -> Probe:
    """Send one max_tokens-1 request to model on a new gRPC stream; never raises, bounded by timeout seconds."""
    if model == "ensemble":
        inputs = ensemble_inputs("Hi", max_tokens=1, stream=True)
    elif model == "tensorrt_llm":  # the llmapi contract (not decoupled: one response on the stream)
        inputs = llmapi_inputs("Hi", 1)
    else:
        inputs = llm_inputs("Hi", True, '{"max_tokens": 1}')
    t0 = time.monotonic()
    try:
        s = Stream(grpc_url)
    except Exception as e:  # noqa: BLE001
        return Probe(model, t0, time.monotonic(), False, f"connect: {e}")
    ok, msg = False, ""
    try:
        s.send(model, inputs, f"probe-{model}-{time.monotonic_ns()}")
        deadline = t0 + timeout
        while True:
            _, result, error = s.next(timeout=deadline - time.monotonic())
            if error is not None:
                msg = str(error)
                ok = any(w in msg for w in BUSY_WORDS)
                break
            if final(result):
                ok = True
                break
    except StreamTimeout:
        msg = f"no answer within {timeout:.0f} s"
    except Exception as e:  # noqa: BLE001
        msg = f"send: {e}"
    finally:
        (s.close if ok and not msg else s.cancel)()
    return Probe(model, t0, time.monotonic(), ok, msg)


class Prober:
    """Probe every model in `models` every `period` seconds (`fast_period` while `hurry` is set)."""

    def __init__(self, endpoints, models: list[str], period: float = 3.0, fast_period: float = 1.0,
                 timeout: float = 20.0):
        self.endpoints = endpoints  # .grpc_url()
        self.models, self.period, self.fast_period, self.timeout = models, period, fast_period, timeout
        self.results: list[Probe] = []
        self.hurry = threading.Event()
        self._held = threading.Event()  # set: no probes (server being restarted or drained)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(m,), name=f"soak-probe-{m}", daemon=True)
                         for m in models]

    def start(self) -> None:
        """Start one probing thread per model."""
        for t in self._threads:
            t.start()

    def hold(self, held: bool) -> None:
        """While held no probe is sent (and answers arriving meanwhile are dropped)."""
        (self._held.set if held else self._held.clear)()

    def _loop(self, model: str) -> None:
        while not self._stop.is_set():
            if not self._held.is_set():
                p = probe_once(self.endpoints.grpc_url(), model, self.timeout)
                if not self._held.is_set():
                    with self._lock:
                        self.results.append(p)
            self._stop.wait(self.fast_period if self.hurry.is_set() else self.period)

    def since(self, model: str, t: float) -> list[Probe]:
        """Probes of model sent at or after t."""
        with self._lock:
            return [p for p in self.results if p.model == model and p.t_sent >= t]

    def last(self, model: str, n: int) -> list[Probe]:
        """The last n probes of model."""
        with self._lock:
            return [p for p in self.results if p.model == model][-n:]

    def stop(self, timeout: float = 5.0) -> None:
        """End the probing threads (each joined for at most timeout seconds)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
