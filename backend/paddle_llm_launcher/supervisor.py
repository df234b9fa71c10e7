"""Bring a model back without a person when one of its parts dies or stalls (Triton 2.51 does neither:
a dead stub is not restarted and the model stays "ready").

A thread of the launcher watches, every `poll_s`:
- tritonserver itself: when it exits (measured: Triton 2.51's Python backend can abort the whole
  server with boost::interprocess::lock_exception when a stub is SIGKILLed holding a shared-memory
  mutex), it is started again with the same command and ports;
- the stub processes (children of tritonserver; each names its model file and instance in its
  argv): one that is gone, or replaced by another process, means its model's instance died (a
  kernel fault, the OOM killer, SIGKILL);
- the failure notices llm instances send when their engine fails (a step raised, a tensor-parallel
  worker died, the stall watchdog fired; restarts.notify_failure), and as a fallback, every
  `metrics_every_s`, the gauge `llm_engine_healthy` on the metrics endpoint (0 = failed).
Then it reloads that model through Triton's repository API (an unload, then a load: Triton keeps a
loaded model with unchanged files as it is). The readiness gate (gate.py) is closed first and opened
once the model is back: between the unload and the load of the model Triton would otherwise report
the server ready (measured: ~0.1 s of 200 with llm UNAVAILABLE), so from the detection on the server
is not ready and a load balancer stops sending. When the stub died with direct requests in flight, Triton
2.51 never releases those requests (their clients would wait forever) and the unload never
completes: after `unload_timeout_s` the supervisor restarts tritonserver itself (same command and
ports), which closes those clients' connections (they get an error, not a hang) and loads every
model afresh. Requests of `ensemble` on a dead llm instance end at once with UNAVAILABLE naming the
instance (engine channel). A load that fails is retried with a doubling back-off (1 s to 30 s).
Restart counts are written to `<state_dir>/restarts.json` before each load; the llm model reads it
when it starts and reports it as `llm_engine_restarts`.
Needs tritonserver with `--model-control-mode explicit` (start_server(supervise=True) sets it).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from paddle_llm_launcher import procs
from paddle_llm_launcher.repository import RepositoryError
from paddle_llm_triton.engine_channel.unix_names import accept_credentials, recv_same_user
from paddle_llm_triton.lifecycle.restarts import RESTARTS_FILE, supervisor_address
# How long a live stub whose engine failed gets to finalize and exit before its processes are killed.
# Triton 2.51 waits for the stub process without a bound, and the stub's finalize takes 1-3 s here
# (tensor parallel: the workers' stop grace included); once in a few soaks the exit took over 30 s.
# Past this the stub is killed, and a restart of tritonserver follows if the unload still hangs:
# recovery stays within 30 s either way.
FINALIZE_GRACE_S = 10.0
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

    def __init__(self, server, state_dir: str | Path, ignore: tuple[str, ...] = (), gate=None,
                 poll_s: float = 0.5, models: tuple[str, ...] | None = None,
                 metrics_every_s: float = 1.0, unload_timeout_s: float = 2.0, log: Callable[[str], None] = print):
        self.server = server
        self.repo = server.repository()
        self.state_dir = Path(state_dir)
        from paddle_llm_launcher.gate import GATE_MODELS

        self.ignore = set(ignore) | set(GATE_MODELS)
        # the models of the served repository (None: every model seen); one loaded later through the
        # repository API by an operator is theirs to manage: its files may exist only in that request
        self.models = None if models is None else set(models)
        self.gate = gate  # a gate.ReadinessGate, held closed while any reload runs
        self.poll_s, self.metrics_every_s = poll_s, metrics_every_s
        self.unload_timeout_s = unload_timeout_s
        self.server_restarts = 0
        self.log = log
        self.events: list[SupervisorEvent] = []
        self.restarts: dict[str, int] = {}
        self._known: dict[tuple[str, str], tuple[int, int]] = {}  # (model, instance) -> (pid, start time)
        self._reloading: set[str] = set()
        self._reloaded_at: dict[str, float] = {}  # model -> time.monotonic() its last reload ended
        self._paused = threading.Event()
        self._restarting = threading.Event()  # the whole server is being restarted: watch nothing
        self._restart_for: tuple[str, str | None, float] | None = None  # (why, model, detection time)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._write_restarts()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._notices = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notices.bind(supervisor_address(self.state_dir))
        accept_credentials(self._notices)
        self._notice_thread = threading.Thread(target=self._listen, name="supervisor-notices", daemon=True)

    def start(self) -> None:
        self._known = self._stubs_now()
        self._thread.start()
        self._notice_thread.start()

    def pause(self) -> None:
        """Stop acting (the launcher drains and unloads on purpose)."""
        self._paused.set()

    def stop(self) -> None:
        self._stop.set()
        try:
            self._notices.sendto(b"", supervisor_address(self.state_dir))  # wake the listener
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(5)
        if self._notice_thread.is_alive():
            self._notice_thread.join(2)
        self._notices.close()

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._reloading)

    # -- watching ----------------------------------------------------------------------------------
    def _stubs_now(self) -> dict[tuple[str, str], tuple[int, int]]:
        out = {}
        for pid, start in procs.children(self.server.pid).items():
            ident = stub_identity(pid)
            if ident is not None and self._watched(ident[0]):
                out[ident] = (pid, start)
        return out

    def _watched(self, model: str) -> bool:
        return model not in self.ignore and (self.models is None or model in self.models)

    def _run(self) -> None:
        next_metrics = 0.0
        while not self._stop.wait(self.poll_s):
            if self._restart_for is not None and not self._paused.is_set():
                self._restart_server(*self._restart_for)
                continue
            if self._paused.is_set() or self._restarting.is_set():
                continue
            code = self.server.proc.poll()
            if code is not None:  # tritonserver itself died (e.g. its Python backend aborted)
                self.events.append(SupervisorEvent(time.monotonic(), "tritonserver", "died", f"exit code {code}"))
                self._request_restart(f"tritonserver exited with code {code}", None, time.monotonic())
                continue
            now_stubs = self._stubs_now()
            self.server.remember_stubs()  # their shm regions, for the clean stop
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
                scraped_at = time.monotonic()
                next_metrics = scraped_at + self.metrics_every_s
                for model, inst in self._scrape_unhealthy():
                    if model and model not in reloading and self._watched(model):
                        self._on_failure(model, "unhealthy", f"instance {inst} reports llm_engine_healthy 0",
                                         observed_at=scraped_at)
                        reloading.add(model)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                got = recv_same_user(self._notices, 8192)
            except OSError:
                return
            data = got[0] if got is not None else b""  # another user's notice is not evidence
            if not data or self._paused.is_set() or self._restarting.is_set():
                continue
            try:
                msg = json.loads(data.decode("utf-8"))
                model, inst = str(msg["model"]), str(msg["instance"])
            except (ValueError, KeyError, TypeError):
                continue
            if self._watched(model):
                self._on_failure(model, "unhealthy", f"instance {inst} reports an engine failure "
                                                     f"({str(msg.get('reason', ''))[:300]})")

    def _scrape_unhealthy(self) -> list[tuple[str, str]]:
        try:
            with urllib.request.urlopen(self.server.metrics_url, timeout=2) as r:
                return unhealthy_instances(r.read().decode("utf-8", "replace"))
        except OSError:
            return []

    # -- acting ------------------------------------------------------------------------------------
    def _on_failure(self, model: str, kind: str, detail: str, observed_at: float | None = None) -> None:
        """observed_at: when the evidence was read (a scrape that began before the model's last reload
        ended may describe the instance that reload replaced: ignored)."""
        with self._lock:
            if model in self._reloading:
                return
            if observed_at is not None and observed_at < self._reloaded_at.get(model, -1.0):
                return
            self._reloading.add(model)
            first = len(self._reloading) == 1
        if first and self.gate is not None:
            self.gate.close()  # readiness false from now until every reload is done
        self.events.append(SupervisorEvent(time.monotonic(), model, kind, detail))
        self.log(f"supervisor: model {model}: {detail}; reloading it (readiness false until it is back)")
        threading.Thread(target=self._reload, args=(model, time.monotonic(), kind), name=f"reload-{model}",
                         daemon=True).start()

    def _request_restart(self, why: str, model: str | None, t0: float) -> None:
        """Ask the watch thread to restart tritonserver (a child's parent-death signal follows the
        thread that started it, so only the long-lived watch thread may start the new server)."""
        with self._lock:
            if self._restart_for is None:
                self._restart_for = (why, model, t0)
                self._restarting.set()

    def _write_restarts(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / (RESTARTS_FILE + ".tmp")
        tmp.write_text(json.dumps(self.restarts))
        tmp.replace(self.state_dir / RESTARTS_FILE)

    def _reload(self, model: str, t0: float, kind: str = "died") -> None:
        """Unload + load `model`. A stub that died leaves Triton 2.51 waiting forever for its requests
        in flight, so after unload_timeout_s the server is restarted; a live stub that failed gets its
        finalize() and exit (FINALIZE_GRACE_S), then its processes are killed."""
        backoff = 1.0
        try:
            with self._lock:
                self.restarts[model] = self.restarts.get(model, 0) + 1
                self._write_restarts()
                old = [self._known.pop(k) for k in [k for k in self._known if k[0] == model]]
            while not self._stop.is_set() and not self._paused.is_set() and not self._restarting.is_set():
                try:
                    self.repo.unload(model)
                    unloaded = self._wait_unloaded(model, self.unload_timeout_s if kind == "died" else FINALIZE_GRACE_S)
                    if not unloaded and kind != "died":
                        self.log(f"supervisor: model {model}: its stub did not finish unloading in "
                                 f"{FINALIZE_GRACE_S:.0f} s; killing it")
                        procs.kill_if_same(old)
                        unloaded = self._wait_unloaded(model, self.unload_timeout_s)
                    if not unloaded:
                        # Triton 2.51 never releases requests that were in flight on a stub that
                        # died (their clients hang), and unloading waits for them: only a new
                        # tritonserver ends them (their connections close) and serves again
                        procs.kill_if_same(old)
                        self._request_restart(f"model {model}: Triton does not unload it (requests of the dead "
                                              f"stub are stuck in Triton 2.51)", model, t0)
                        return
                    self.repo.load(model)
                except (RepositoryError, OSError) as e:
                    if self._restarting.is_set():
                        return
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
            if not self._restarting.is_set():  # else the restart clears every reload
                self._reload_done(model)

    def _reload_done(self, model: str) -> None:
        with self._lock:
            self._reloading.discard(model)
            self._reloaded_at[model] = time.monotonic()
            last = not self._reloading
        if last and self.gate is not None and not self._paused.is_set() and not self._stop.is_set():
            self.gate.open(log=self.log)

    def _restart_server(self, why: str, model: str | None, t0: float) -> None:
        """Watch thread: restart tritonserver until it is ready again (doubling back-off up to 30 s);
        every model is loaded afresh, so every reload in progress is over."""
        self.log(f"supervisor: {why}; restarting tritonserver")
        backoff = 1.0
        while not self._stop.is_set() and not self._paused.is_set():
            self.server.restart()
            try:
                self.server.wait_ready(timeout=600)
                break
            except (RuntimeError, TimeoutError) as e:
                self.events.append(SupervisorEvent(time.monotonic(), model or "tritonserver", "restart_failed", str(e)))
                self.log(f"supervisor: tritonserver did not come back ({e}); retrying in {backoff:.0f} s")
                if self._stop.wait(backoff):
                    return
                backoff = min(30.0, backoff * 2)
        else:
            return
        took = time.monotonic() - t0
        self.server_restarts += 1
        with self._lock:
            self._known = self._stubs_now()
            now = time.monotonic()
            for m in set(self._reloading) | set(self._reloaded_at) | {k[0] for k in self._known}:
                self._reloaded_at[m] = now
            self._reloading.clear()
            self._restart_for = None
            self._restarting.clear()
        detail = f"restart {self.restarts[model]}" if model else f"server restart {self.server_restarts}"
        self.events.append(SupervisorEvent(time.monotonic(), model or "tritonserver", "server_restarted", detail, took))
        self.log(f"supervisor: tritonserver restarted; serving again after {took:.1f} s ({detail})")

    def _wait_unloaded(self, model: str, timeout: float = 60.0) -> bool:
        """True once Triton no longer holds `model` (False after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.repo.index().get(model) not in ("READY", "UNLOADING"):
                return True
            time.sleep(0.1)
        return False
