"""The 15 s record: every `interval` seconds, the LLM gauges of each engine model from the metrics
endpoint (KV used / free blocks, running / waiting, llm_engine_healthy), the RSS of every process of
the server tree from /proc (tritonserver, each stub by instance, TP workers, the launcher), and
readiness. The per-interval latency, throughput and error figures are computed from the request
outcomes by the report (report.py), on the same interval grid."""

from __future__ import annotations

import threading
import time

from clients import scrape_metrics  # tests/support
import proctree

GAUGES = {"kv_used": "llm_kv_cache_used_blocks", "kv_free": "llm_kv_cache_free_blocks",
          "running": "llm_num_requests_running", "waiting": "llm_num_requests_waiting",
          "healthy": "llm_engine_healthy"}


def engine_gauges(metrics_url: str, models: list[str], timeout: float = 5.0) -> dict:
    """{model: {kv_used, kv_free, running, waiting, healthy}} (a value None when absent), or
    {"error": message} when the endpoint does not answer."""
    try:
        m = scrape_metrics(metrics_url, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - a dead server has no metrics
        return {"error": f"{type(e).__name__}: {e}"}
    out = {}
    for model in models:
        vals = {}
        for key, name in GAUGES.items():
            found = m.find(name, model=model)
            vals[key] = sum(v for _, v in found) if found else None
        out[model] = vals
    return out


def rss_by_process(procs: list[proctree.Proc]) -> dict:
    """{process key: {"name", "pid", "rss_mb"}} for the live processes."""
    out = {}
    for p in procs:
        rss = proctree.rss_bytes(p.pid)
        if rss is not None:
            out[p.key] = {"name": p.name, "pid": p.pid, "rss_mb": round(rss / 2**20, 2)}
    return out


class Monitor:
    """Samples every `interval` seconds on its own thread (and once more on `sample_now()`)."""

    def __init__(self, server_fn, engine_models: list[str], ready_models: list[str], interval: float = 15.0,
                 on_unhealthy=None, traffic_on=None):
        self.server_fn, self.engine_models, self.ready_models = server_fn, engine_models, ready_models
        self.interval = interval
        self.on_unhealthy = on_unhealthy  # (model, t) when llm_engine_healthy is 0
        self.traffic_on = traffic_on      # () -> bool: traffic running (RSS fits use those samples only)
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._held = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="soak-monitor", daemon=True)

    def start(self) -> None:
        """Start sampling on the monitor's thread."""
        self._thread.start()

    def hold(self, held: bool) -> None:
        """While held (server being restarted or drained) no sample is taken."""
        (self._held.set if held else self._held.clear)()

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            if not self._held.is_set():
                self.sample_now()
            next_t += self.interval
            self._stop.wait(max(next_t - time.monotonic(), 0.0))

    def sample_now(self) -> dict:
        """Take one sample (gauges, RSS, readiness) now, store and return it."""
        srv = self.server_fn()
        t = time.monotonic()
        s = {"t": t, "server": getattr(srv, "generation", 0),
             "traffic": bool(self.traffic_on()) if self.traffic_on else False,
             "engines": engine_gauges(srv.metrics_url, self.engine_models),
             "rss": rss_by_process(srv.processes()),
             "ready": {"server": srv.ready("/v2/health/ready"),
                       **{m: srv.ready(f"/v2/models/{m}/ready") for m in self.ready_models}}}
        with self._lock:
            self.samples.append(s)
        if self.on_unhealthy and "error" not in s["engines"]:
            for model, vals in s["engines"].items():
                if vals.get("healthy") == 0:
                    self.on_unhealthy(model, t)
        return s

    def stop(self) -> None:
        """End the sampling thread (joined for at most 15 s)."""
        self._stop.set()
        self._thread.join(15)

    def snapshot(self) -> list[dict]:
        """The samples so far (a copy)."""
        with self._lock:
            return list(self.samples)
