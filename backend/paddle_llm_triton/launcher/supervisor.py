"""Bring a model back without a person when one of its parts dies or stalls (Triton 2.51 does neither:
a dead stub is not restarted and the model stays "ready").

A thread of the launcher watches, every `poll_s`:
- the stub processes (children of tritonserver; each names its model file and instance in its
  argv): one that is gone, or replaced by another process, means its model's instance died (a
  kernel fault, the OOM killer, SIGKILL);
- every `metrics_every_s`, the gauge `llm_engine_healthy` on the metrics endpoint: 0 means the
  instance's engine failed (a step raised, a tensor-parallel worker died, the stall watchdog fired).
Then it reloads that model through Triton's repository API (an unload, then a load: Triton keeps a
loaded model with unchanged files as it is). From the unload on, the model and the server are not
ready, so a load balancer stops sending. When the stub died with direct requests in flight, Triton
2.51 never releases those requests (their clients would wait forever) and the unload never
completes: after `unload_timeout_s` the supervisor restarts tritonserver itself (same command and
ports), which closes those clients' connections (they get an error, not a hang) and loads every
model afresh. Requests of `ensemble` on a dead llm instance end at once with UNAVAILABLE naming the
instance (engine channel). A load that fails is retried with a doubling back-off (1 s to 30 s).
Restart counts are written to `<state_dir>/restarts.json` before each load; the llm model reads it
when it starts and reports it as `llm_engine_restarts_total`.
Needs tritonserver with `--model-control-mode explicit` (start_server(supervise=True) sets it).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from paddle_llm_triton.launcher import procs
from paddle_llm_triton.launcher.repository import RepositoryClient, RepositoryError
from paddle_llm_triton.restarts import RESTARTS_FILE
_HEALTHY = re.compile(r'^llm_engine_healthy\{([^}]*)\}\s+(\S+)', re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class SupervisorEvent:
    """What the supervisor saw or did: kind "died" | "unhealthy" | "reloaded" | "reload_failed"."""

    time: float          # time.monotonic()
    model: str
    kind: str
    detail: str
    seconds: float = 0.0  # "reloaded": from the detection to serving again


def stub_identity(pid: int) -> tuple[str, str] | None:
    """(model, instance) of a Python-backend stub process, from its argv
    (`stub <repo>/<model>/<version>/model.py <region> ... <instance name> <mode>`)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    argv = [a.decode("utf-8", "replace") for a in argv if a]
    if len(argv) < 4 or not argv[0].endswith(procs.STUB_NAME):
        return None
    return Path(argv[1]).parents[1].name, argv[-2]


def unhealthy_instances(metrics_text: str) -> list[tuple[str, str]]:
    """(model, instance) of every llm_engine_healthy sample that is 0."""
    out = []
    for labels, value in _HEALTHY.findall(metrics_text):
        try:
            if float(value) != 0.0:
                continue
        except ValueError:
            continue
        d = dict(_LABEL.findall(labels))
        out.append((d.get("model", ""), d.get("instance", "")))
    return out


class Supervisor:
    """See the module doc. `server`: the TritonServer handle (pid, ports); `log(line)` prints."""

    def __init__(self, server, state_dir: str | Path, ignore: tuple[str, ...] = (), poll_s: float = 0.5,
                 metrics_every_s: float = 1.0, unload_timeout_s: float = 5.0, log: Callable[[str], None] = print):
        self.server = server
        self.repo = RepositoryClient(server.http_port)
        self.state_dir = Path(state_dir)
        self.ignore = set(ignore)
        self.poll_s, self.metrics_every_s = poll_s, metrics_every_s
        self.unload_timeout_s = unload_timeout_s
        self.server_restarts = 0
        self.log = log
        self.events: list[SupervisorEvent] = []
        self.restarts: dict[str, int] = {}
        self._known: dict[tuple[str, str], tuple[int, int]] = {}  # (model, instance) -> (pid, start time)
        self._reloading: set[str] = set()
        self._paused = threading.Event()
        self._restarting = threading.Event()  # the whole server is being restarted: watch nothing
        self._restart_for: tuple[str, float] | None = None  # (model, detection time): restart asked
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._write_restarts()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def start(self) -> None:
        self._known = self._stubs_now()
        self._thread.start()

    def pause(self) -> None:
        """Stop acting (the launcher drains and unloads on purpose)."""
        self._paused.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._reloading)

    # -- watching ----------------------------------------------------------------------------------
    def _stubs_now(self) -> dict[tuple[str, str], tuple[int, int]]:
        out = {}
        for pid, start in procs.children(self.server.pid).items():
            ident = stub_identity(pid)
            if ident is not None and ident[0] not in self.ignore:
                out[ident] = (pid, start)
        return out

    def _run(self) -> None:
        next_metrics = 0.0
        while not self._stop.wait(self.poll_s):
            if self._restart_for is not None and not self._paused.is_set():
                model, t0 = self._restart_for
                try:
                    self._restart_server(model, t0)
                finally:
                    self._restart_for = None
                    self._restarting.clear()
                    with self._lock:
                        self._reloading.discard(model)
                continue
            if self._paused.is_set() or self._restarting.is_set() or self.server.proc.poll() is not None:
                continue
            now_stubs = self._stubs_now()
            with self._lock:
                reloading = set(self._reloading)
            for (model, inst), ident in list(self._known.items()):
                if model in reloading:
                    continue
                if now_stubs.get((model, inst)) != ident:
                    self._on_failure(model, "died", f"stub {inst} (pid {ident[0]}) exited")
                    reloading.add(model)
            for key, ident in now_stubs.items():
                if key[0] not in reloading:
                    self._known[key] = ident
            if time.monotonic() >= next_metrics:
                next_metrics = time.monotonic() + self.metrics_every_s
                for model, inst in self._scrape_unhealthy():
                    if model and model not in reloading and model not in self.ignore:
                        self._on_failure(model, "unhealthy", f"instance {inst} reports llm_engine_healthy 0")
                        reloading.add(model)

    def _scrape_unhealthy(self) -> list[tuple[str, str]]:
        try:
            with urllib.request.urlopen(self.server.metrics_url, timeout=2) as r:
                return unhealthy_instances(r.read().decode("utf-8", "replace"))
        except OSError:
            return []

    # -- acting ------------------------------------------------------------------------------------
    def _on_failure(self, model: str, kind: str, detail: str) -> None:
        with self._lock:
            if model in self._reloading:
                return
            self._reloading.add(model)
        self.events.append(SupervisorEvent(time.monotonic(), model, kind, detail))
        self.log(f"supervisor: model {model}: {detail}; reloading it (readiness false until it is back)")
        threading.Thread(target=self._reload, args=(model, time.monotonic()), name=f"reload-{model}",
                         daemon=True).start()

    def _write_restarts(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / (RESTARTS_FILE + ".tmp")
        tmp.write_text(json.dumps(self.restarts))
        tmp.replace(self.state_dir / RESTARTS_FILE)

    def _reload(self, model: str, t0: float) -> None:
        backoff = 1.0
        try:
            with self._lock:
                self.restarts[model] = self.restarts.get(model, 0) + 1
                self._write_restarts()
                old = [self._known.pop(k) for k in [k for k in self._known if k[0] == model]]
            while not self._stop.is_set() and not self._paused.is_set():
                try:
                    self.repo.unload(model)
                    if not self._wait_unloaded(model, self.unload_timeout_s):
                        # Triton 2.51 never releases requests that were in flight on a stub that
                        # died (their clients hang), and unloading waits for them: only a new
                        # tritonserver ends them (their connections close) and serves again
                        procs.kill_if_same(old)
                        # restarted on the watch thread: a child's parent-death signal follows the
                        # thread that started it, and this reload thread ends now
                        self._restart_for = (model, t0)
                        self._restarting.set()
                        return
                    self.repo.load(model)
                except (RepositoryError, OSError) as e:
                    self.events.append(SupervisorEvent(time.monotonic(), model, "reload_failed", str(e)))
                    self.log(f"supervisor: model {model}: reload failed ({e}); retrying in {backoff:.0f} s")
                    if self._stop.wait(backoff):
                        return
                    backoff = min(30.0, backoff * 2)
                    continue
                took = time.monotonic() - t0
                for key, ident in self._stubs_now().items():
                    if key[0] == model:
                        self._known[key] = ident
                self.events.append(SupervisorEvent(time.monotonic(), model, "reloaded",
                                                   f"restart {self.restarts[model]}", took))
                self.log(f"supervisor: model {model}: serving again after {took:.1f} s "
                         f"(restart {self.restarts[model]})")
                return
        finally:
            if self._restart_for is None:  # else the watch thread clears it after the restart
                with self._lock:
                    self._reloading.discard(model)

    def _restart_server(self, model: str, t0: float) -> None:
        self.log(f"supervisor: model {model}: Triton does not unload it within {self.unload_timeout_s:.0f} s "
                 f"(requests of the dead stub are stuck in Triton 2.51); restarting tritonserver")
        self.server.restart()
        try:
            self.server.wait_ready(timeout=600)
        except (RuntimeError, TimeoutError) as e:
            self.events.append(SupervisorEvent(time.monotonic(), model, "restart_failed", str(e)))
            self.log(f"supervisor: tritonserver did not come back: {e}")
            return
        self._known = self._stubs_now()
        took = time.monotonic() - t0
        self.server_restarts += 1
        self.events.append(SupervisorEvent(time.monotonic(), model, "server_restarted",
                                           f"restart {self.restarts[model]}", took))
        self.log(f"supervisor: tritonserver restarted; serving again after {took:.1f} s (model {model} restart "
                 f"{self.restarts[model]})")

    def _wait_unloaded(self, model: str, timeout: float = 60.0) -> bool:
        """True once Triton no longer holds `model` (False after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.repo.index().get(model) not in ("READY", "UNLOADING"):
                return True
            time.sleep(0.1)
        return False
