"""The soak's eyes between the 15 s samples: every 0.5 s it reads readiness (/v2/health/ready and
/v2/models/<m>/ready) and the server's process tree, and keeps `Incident`s, one per time a part of
the server was down: opened by an injected fault, or by what it sees itself (a stub or worker gone
without a fault = crash; probes failing = wedged; llm_engine_healthy 0 = unhealthy). An incident is
recovered when a probe sent after it opened succeeds on every affected model; readiness is watched
meanwhile (it must go false while the model is down)."""

from __future__ import annotations

import dataclasses
import threading
import time

from records import Recorder

# what a dead part takes down with it (ensemble calls preprocessing, llm and postprocessing)
DEPENDANTS = {"llm": ["llm", "ensemble", "tensorrt_llm"], "preprocessing": ["preprocessing", "ensemble", "tensorrt_llm"],
              "postprocessing": ["postprocessing", "ensemble"], "ensemble": ["ensemble"],
              "tensorrt_llm": ["tensorrt_llm"]}
STUB_EXIT_GRACE_S = 3.0  # a stub exit this close to tritonserver's own exit is part of the server's


def instance_model(instance: str) -> str:
    """"llm_tp2_0_0" -> "llm_tp2" (Triton instance names are <model>_<group>_<index>)."""
    parts = instance.rsplit("_", 2)
    return parts[0] if len(parts) == 3 else instance


@dataclasses.dataclass
class Incident:
    """One stretch during which `model` (and `affected`) could not serve."""

    kind: str            # fault | crash | wedge | unhealthy
    what: str
    model: str
    affected: list
    t_open: float
    injected: bool
    ready_false_at: float | None = None      # first readiness poll != 200 after t_open
    ready_200_while_down: list = dataclasses.field(default_factory=list)  # poll times
    recovered_at: float | None = None  # answer of the first probe that succeeded on every affected model
    # when the first of those probes was sent (the latest over the affected models): the model took a
    # request then and served it, so readiness 200 from that moment on was true
    serving_from: float | None = None
    closed_at: float | None = None
    closed_how: str = ""                      # recovered | restarted by the soak | end of soak
    person_needed: bool = False
    server_exited_at: float | None = None     # tritonserver exited during it (a supervisor restarts it)

    @property
    def open(self) -> bool:
        """True until the incident is closed (recovered, or ended by a restart or the end of the soak)."""
        return self.closed_at is None


class Watcher:
    """Readiness and process watching, and the incidents. server(): the current SoakServer."""

    def __init__(self, server_fn, prober, recorder: Recorder, models: list[str], period: float = 0.5,
                 wedge_after: int = 2, ready_lag_s: float = 5.0):
        self.server_fn, self.prober, self.recorder = server_fn, prober, recorder
        self.models, self.period, self.wedge_after, self.ready_lag_s = models, period, wedge_after, ready_lag_s
        self.readiness: list[tuple] = []   # (t, server code, {model: code})
        self.incidents: list[Incident] = []
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._held = threading.Event()
        self._procs: dict[tuple, object] = {}  # (pid, start) -> Proc of the last poll
        self._pending_exits: list[tuple] = []  # (t seen, Proc) of stubs / workers gone, judged later
        self._clear_since: dict[str, float] = {}  # model -> probes before this do not count (an incident or a hold)
        self._thread = threading.Thread(target=self._loop, name="soak-watch", daemon=True)

    def start(self) -> None:
        """Start watching on the watcher's thread."""
        self._thread.start()

    def hold(self, held: bool) -> None:
        """While held (the soak restarts or drains the server) nothing is judged."""
        with self._lock:
            if held:
                self._held.set()
            else:
                self._procs, self._pending_exits = {}, []
                now = time.monotonic()
                self._clear_since = {m: now for m in self.models}
                self._held.clear()

    def stop(self) -> None:
        """End the watching thread (joined for at most 10 s)."""
        self._stop.set()
        self._thread.join(10)

    # ---- incidents

    def open_incident(self, kind: str, what: str, model: str, injected: bool, t: float | None = None) -> Incident:
        """Record that `model` (and what depends on it) is down from t (monotonic seconds, default now)."""
        inc = Incident(kind, what, model, [m for m in DEPENDANTS.get(model, [model]) if m in self.models] or [model],
                       time.monotonic() if t is None else t, injected)
        with self._lock:
            self.incidents.append(inc)
        self.prober.hurry.set()
        self.recorder.event(kind, what, t=inc.t_open, model=model)
        return inc

    def _affected_by(self, model: str) -> list[str]:
        """The watched models a dead `model` takes down; every one for a model no client calls (the
        launcher's readiness gates hold the whole server's readiness)."""
        return [m for m in DEPENDANTS.get(model, [model]) if m in self.models] or list(self.models)

    def _covering(self, model: str, t: float) -> Incident | None:
        """An incident affecting model that was open at time t (opened at most one poll after it)."""
        with self._lock:
            return next((i for i in self.incidents if model in i.affected and i.t_open <= t + self.period
                         and (i.closed_at is None or i.closed_at >= t)), None)

    def open_for(self, model: str) -> Incident | None:
        """The open incident that affects model, None when it serves."""
        with self._lock:
            for inc in self.incidents:
                if inc.open and model in inc.affected:
                    return inc
        return None

    def close(self, inc: Incident, how: str, t: float | None = None) -> None:
        """Close an incident (how: recovered / restarted by the soak / ...) at t (default now)."""
        with self._lock:
            if inc.open:
                inc.closed_at = time.monotonic() if t is None else t
                inc.closed_how = how
                for m in inc.affected:
                    self._clear_since[m] = max(self._clear_since.get(m, 0.0), inc.closed_at)
            if not any(i.open for i in self.incidents):
                self.prober.hurry.clear()

    def overdue(self, bound_s: float) -> list[Incident]:
        """Open incidents older than bound_s (the server needs a person)."""
        now = time.monotonic()
        with self._lock:
            return [i for i in self.incidents if i.open and now - i.t_open > bound_s]

    # ---- the loop

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            if self._held.is_set():
                continue
            try:
                self._poll()
            except Exception as e:  # noqa: BLE001 - watching must go on
                self.recorder.event("note", f"watcher error: {type(e).__name__}: {e}")

    def _poll(self) -> None:
        srv = self.server_fn()
        t = time.monotonic()
        server_code = srv.ready("/v2/health/ready", timeout=2)
        codes = {m: srv.ready(f"/v2/models/{m}/ready", timeout=2) for m in self.models}
        with self._lock:
            if self._held.is_set():
                return
            self.readiness.append((t, server_code, codes))
            self._check_processes(srv, t)
            self._check_probes(t)
            for inc in self.incidents:
                if not inc.open:
                    continue
                down = server_code != 200 or codes.get(inc.model) != 200
                if down and inc.ready_false_at is None:
                    inc.ready_false_at = t
                if not down and t - inc.t_open > self.ready_lag_s and inc.recovered_at is None:
                    inc.ready_200_while_down.append(t)
                self._check_recovered(inc, server_code == 200 and codes.get(inc.model) == 200)

    def _check_processes(self, srv, t: float) -> None:
        procs = {(p.pid, p.start): p for p in srv.processes() if p.role in ("tritonserver", "stub", "tp_worker", "launcher")}
        gone = [p for key, p in self._procs.items() if key not in procs]
        self._procs = procs
        # the whole server first: its stubs go with it, in this poll or the one before
        for p in gone:
            if p.role not in ("tritonserver", "launcher"):
                continue
            # during an incident (a fault, or a crash it follows from) that incident now needs every model
            # back: a supervisor restarts tritonserver when a stub died; otherwise it is a crash
            during = next((i for i in self.incidents if i.open and i.injected), None) or \
                next((i for i in self.incidents if i.open), None)
            if during is not None:
                during.affected = list(self.models)
                during.server_exited_at = t
                during.what += f" (then {p.name} pid {p.pid} exited)"
                self.recorder.event("note", f"{p.name} (pid {p.pid}) exited during '{during.what}'", t=t)
            else:
                inc = self.open_incident("crash", f"{p.name} (pid {p.pid}) exited without an injected fault",
                                         "llm", injected=False, t=t)
                inc.affected, inc.server_exited_at = list(self.models), t
        self._pending_exits += [(t, p) for p in gone if p.role not in ("tritonserver", "launcher")]
        self._judge_part_exits(t)

    def _judge_part_exits(self, t: float) -> None:
        """A stub or worker exit is judged STUB_EXIT_GRACE_S after it was seen: a tritonserver that
        exits in that time (a supervisor restarting it kills its stubs first) takes the exit into the
        incident it ended; a part of an incident already open is that incident's; else it is a crash."""
        keep = []
        for seen, p in self._pending_exits:
            inst = p.name.split(":")[1]
            model = instance_model(inst)
            server_exit = next((i for i in self.incidents if i.server_exited_at is not None
                                and seen - 1.0 <= i.server_exited_at <= seen + STUB_EXIT_GRACE_S), None)
            if server_exit is not None:
                continue  # the server's exit took it (every model is affected already)
            if t - seen < STUB_EXIT_GRACE_S:
                keep.append((seen, p))
                continue
            affected = self._affected_by(model)
            if not any(self._covering(m, seen) for m in affected):
                inc = self.open_incident("crash", f"{p.name} (pid {p.pid}) exited without an injected fault",
                                         model, injected=False, t=seen)
                inc.affected = affected
        self._pending_exits = keep

    def _check_probes(self, t: float) -> None:
        for m in self.models:
            if self.open_for(m) is not None:
                continue
            last = [p for p in self.prober.last(m, self.wedge_after) if p.t_sent >= self._clear_since.get(m, 0.0)]
            if len(last) == self.wedge_after and not any(p.ok for p in last):
                self.open_incident("wedge", f"{m}: {self.wedge_after} probes failed: {last[-1].message[:200]}",
                                   m, injected=False, t=last[0].t_sent)

    def _check_recovered(self, inc: Incident, ready: bool) -> None:
        if inc.recovered_at is not None or not ready:
            return
        done, sent = [], []
        for m in inc.affected:
            ok = [p for p in self.prober.since(m, inc.t_open + 0.5) if p.ok]
            if not ok:
                return
            done.append(ok[0].t_done)
            sent.append(ok[0].t_sent)
        inc.recovered_at = max(done)
        inc.serving_from = max(sent)
        self.close(inc, "recovered", t=inc.recovered_at)
        self.recorder.event("note", f"recovered from '{inc.what}' after {inc.recovered_at - inc.t_open:.1f} s")

    def note_unhealthy(self, model: str, t: float) -> None:
        """The 15 s sampler saw llm_engine_healthy 0 for model."""
        with self._lock:
            if not self._held.is_set() and self.open_for(model) is None:
                self.open_incident("unhealthy", f"{model}: llm_engine_healthy 0", model, injected=False, t=t)
