"""Soak and fault suite: the server of `make serve` under mixed traffic for a bounded time, with faults
injected on a schedule; writes report.json and soak.png and exits non-zero when a pass criterion
fails (the reasons are listed at the end).

    .venv/bin/python tests/soak/run_soak.py [--minutes 30] [--clients 6] [--out build/soak]
        [--faults stub,tp,flood,drain | none] [--fault-every-s S] [--warmup-s 120] [--fail-fast]

`make soak` runs it with SOAK_MINUTES (default 30). Phases: the server (scripts/launch_triton.py as
`make serve` runs it, on a copy of model_repository with a low waiting limit and an extra
tensor-parallel model `llm_tp2`), warm-up traffic, traffic with one fault every --fault-every-s
seconds in turn (300 s in a 30-minute soak): SIGKILL of the llm stub, SIGKILL of a TP worker, a flood
past the waiting limit; traffic stopped and KV checked back at the idle baseline, then the drain
(SIGTERM with 4 streams in flight). When a part stays down longer than 30 s the server needed a person: that is a failure,
and the soak restarts the server itself (unless --no-restart) so that the rest of the schedule
still runs. Every wait is bounded; a watchdog ends the soak (and its server) if it overruns.
Only processes the soak started are signalled.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "support"))  # a script, not run by pytest: clients, repo_edit, tiny_model

import checks as C  # noqa: E402
import faults as F  # noqa: E402
import report as R  # noqa: E402
import payloads  # noqa: E402
import repo as repo_copy  # noqa: E402
import rss as rss_fit  # noqa: E402
from monitor import Monitor, engine_gauges  # noqa: E402
from probes import Prober  # noqa: E402
from records import Recorder  # noqa: E402
from server import REPO_ROOT, SoakServer  # noqa: E402
from traffic import Context, Traffic, mix  # noqa: E402
from watch import Watcher  # noqa: E402

FAULT_KINDS = {"stub": "kill_llm_stub", "tp": "kill_tp_worker", "flood": "flood", "drain": "drain"}


def parse_args(argv=None):
    """The command line (see the module doc); exits with a usage error on bad values."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 30)),
                    help="minutes of traffic (warm-up included; start-up and drain come on top)")
    ap.add_argument("--clients", type=int, default=6, help="concurrent clients on ensemble / llm (4-8)")
    ap.add_argument("--mix", default="full", choices=("full", "short"))
    ap.add_argument("--faults", default="stub,tp,flood,drain", help="comma list of stub,tp,flood,drain or 'none'")
    ap.add_argument("--fault-every-s", type=float, default=None,
                    help="seconds between faults, taken in turn (default (traffic - warm-up - 60 s) / 3 "
                         "within 40..300: every kind at least once)")
    ap.add_argument("--warmup-s", type=float, default=120.0,
                    help="seconds of traffic before the first fault")
    ap.add_argument("--rss-warmup-s", type=float, default=300.0,
                    help="seconds after a process appears (or traffic starts) left out of its RSS fit")
    ap.add_argument("--interval", type=float, default=15.0, help="seconds between recorded samples")
    ap.add_argument("--stall-s", type=float, default=30.0, help="no response for this long = a stalled request")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="bound of one request")
    ap.add_argument("--rss-bound", type=float, default=rss_fit.DEFAULT_BOUND_MB_PER_MIN, help="MB/min per process")
    ap.add_argument("--rss-step-bound", type=float, default=rss_fit.DEFAULT_STEP_BOUND_MB,
                    help="MB of upward RSS level shifts across fault windows, per process lifetime")
    ap.add_argument("--max-waiting", type=int, default=8, help="llm waiting-queue limit in the soak's copy")
    ap.add_argument("--max-num-seqs", type=int, default=16, help="llm max_num_seqs in the soak's copy")
    ap.add_argument("--model-dir", default=str(REPO_ROOT / "build" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--out", default=str(REPO_ROOT / "build" / "soak"))
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--no-restart", action="store_true",
                    help="do not restart a server that stayed down (the rest of the schedule is then skipped)")
    ap.add_argument("--fail-fast", action="store_true",
                    help="end the traffic at the first stall, crash or part left down")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    kinds = [] if args.faults.strip() == "none" else [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        ap.error(f"unknown fault kinds {unknown} (known: {', '.join(FAULT_KINDS)}, none)")
    if not 1 <= args.clients <= 16:
        ap.error("--clients must be 1..16")
    args.fault_kinds = kinds
    if args.fault_every_s is None:
        args.fault_every_s = min(300.0, max(40.0, (args.minutes * 60 - args.warmup_s - 60) / 3))
    return args


class Soak:
    """One soak run (see module doc); `run()` returns the process exit code."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.rec = Recorder()
        self.ctx = Context(args.stall_s, args.timeout_s)
        self.stop_asked = threading.Event()
        self.server: SoakServer | None = None
        self.generation = 0
        self.server_starts: list[dict] = []
        self.restarts: list[dict] = []
        self.faults: list[dict] = []
        self.traffic_on = False
        self.drain_rec = None
        self.idle_end: dict = {}
        self.kv_baseline: dict = {}
        self.kv_start: dict = {}  # model -> gauges at idle before the traffic

    # ---- server

    def _start_server(self, why: str) -> None:
        srv = SoakServer(self.repo.path, Path(self.args.model_dir), self.out, self.generation)
        srv.generation = self.generation
        self.generation += 1
        srv.start()
        self.server = srv
        ready = srv.wait_ready(self.args.ready_timeout)
        self.ctx.set_endpoints(srv.grpc_url, srv.http_base, srv.openai_base)
        self.server_starts.append({"generation": srv.generation, "why": why, "ready_after_s": round(ready, 2),
                                   "ports": [srv.http_port, srv.grpc_port, srv.metrics_port],
                                   "log": str(srv.log_path)})
        self.rec.event("note", f"server {srv.generation} ready in {ready:.1f} s ({why}); log {srv.log_path}")

    def _restart(self, why: str) -> None:
        """The server needed a person: do the person's job (kill everything, start again)."""
        t = time.monotonic()
        self.rec.event("restart", f"restarting the server: {why}", t=t)
        self.traffic.hold()
        for part in (self.watcher, self.prober, self.monitor):
            part.hold(True)
        left = self.server.kill_all()
        if left:
            self.rec.event("note", f"still alive after SIGKILL: {[p.name for p in left]}")
        try:
            self._start_server(f"restart: {why}")
        finally:
            for inc in self.watcher.incidents:
                if inc.open:
                    self.watcher.close(inc, "restarted by the soak")
            for part in (self.watcher, self.prober, self.monitor):
                part.hold(False)
            self.traffic.resume()
        self.restarts.append({"t": t, "t_ready": time.monotonic(), "why": why,
                              "ready_after_s": self.server_starts[-1]["ready_after_s"]})

    # ---- phases

    def run(self) -> int:
        a = self.args
        self.out.mkdir(parents=True, exist_ok=True)
        tiny = repo_copy.make_tiny_model(self.out, Path(a.model_dir)) if "tp" in a.fault_kinds else None
        loras = repo_copy.make_adapters(self.out, Path(a.model_dir))
        self.repo = repo_copy.prepare(self.out, tiny, max_waiting=a.max_waiting, max_num_seqs=a.max_num_seqs,
                                      tp="tp" in a.fault_kinds, loras=loras)
        payloads.LORA_NAMES = self.repo.loras
        engines = ["llm"] + ([self.repo.tp_model] if self.repo.tp_model else [])
        probed = ["llm", "ensemble", "tensorrt_llm"] + ([self.repo.tp_model] if self.repo.tp_model else [])
        self.rec.event("note", f"repository copy {self.repo.path} ({self.repo.waiting_key} {a.max_waiting}, "
                               f"max_num_seqs {a.max_num_seqs}, tp model {self.repo.tp_model})")
        watchdog = threading.Timer(a.minutes * 60 + a.ready_timeout * 3 + 900, self._overrun)
        watchdog.daemon = True
        watchdog.start()
        try:
            self._start_server("start")
            for m in engines:
                ok, _, last = F.wait_kv(self.server.metrics_url, m, 0.0, timeout=30)
                self.kv_baseline[m] = last.get("kv_used") if last.get("kv_used") is not None else 0.0
                self.kv_start[m] = last
            self.prober = Prober(self.ctx, probed)
            self.watcher = Watcher(lambda: self.server, self.prober, self.rec, probed, ready_lag_s=C.READY_LAG_S)
            self.monitor = Monitor(lambda: self.server, engines, probed, a.interval,
                                   on_unhealthy=self.watcher.note_unhealthy, traffic_on=lambda: self.traffic_on)
            self.traffic = Traffic(self.ctx, self.rec, a.clients, mix(a.mix), a.seed, tp_model=self.repo.tp_model)
            for part in (self.monitor, self.prober, self.watcher):
                part.start()
            self._traffic_phase()
            self._after_traffic(engines)
        except Exception as e:  # noqa: BLE001 - reported as a failure, with the report still written
            self.rec.event("note", f"soak aborted: {type(e).__name__}: {e}")
            self.aborted = f"{type(e).__name__}: {e}"
        finally:
            watchdog.cancel()
            for name in ("traffic", "monitor", "prober", "watcher"):
                part = getattr(self, name, None)
                if part is not None:
                    part.stop(timeout=5) if name == "traffic" else part.stop()
            left = self.server.kill_all() if self.server is not None else []
            self.left_behind = [p.name for p in left]
        return self._finish()

    def _traffic_phase(self) -> None:
        a = self.args
        self.traffic.start()
        self.traffic_on = True
        self.t_traffic0 = time.monotonic()
        t_end = self.t_traffic0 + a.minutes * 60
        schedule = [k for k in a.fault_kinds if k in ("stub", "tp", "flood")]
        next_fault = self.t_traffic0 + min(a.warmup_s, a.minutes * 60 / 4)
        # a fault kind that has not run yet may stretch the traffic by up to half its length (restarts
        # of a server that needed a person take their time), bounded
        t_stretch = t_end + min(a.minutes * 30, 300)
        injected: set = set()
        i = 0

        def deadline() -> float:
            return t_end if set(schedule) <= injected else t_stretch

        # past the deadline the traffic goes on while a part is down (each incident is bounded:
        # recovered, or restarted 30 s after it opened), so that the final checks see a serving server
        while not self.stop_asked.is_set() and (time.monotonic() < deadline()
                                                or any(x.open for x in self.watcher.incidents)):
            for inc in self.watcher.overdue(C.RECOVER_WITHIN_S):
                if not inc.person_needed:
                    inc.person_needed = True
                    self.rec.event("note", f"FAIL: not serving {C.RECOVER_WITHIN_S:.0f} s after '{inc.what}': "
                                           f"the server needs a person")
                    if a.fail_fast:
                        self.stop_asked.set()
                    elif not a.no_restart:
                        self._restart(f"'{inc.what}' not recovered within {C.RECOVER_WITHIN_S:.0f} s")
                        next_fault = max(next_fault, time.monotonic() + 10)
                    else:
                        self.watcher.close(inc, "left down (--no-restart)")
                        schedule = []
            if a.fail_fast and (self.traffic.stalls_seen or any(not x.injected for x in self.watcher.incidents)):
                self.stop_asked.set()
                break
            busy = any(x.open for x in self.watcher.incidents)
            left = deadline() - time.monotonic()
            if schedule and not busy and time.monotonic() >= next_fault:
                kind = schedule[i % len(schedule)]
                # a kill must leave time to judge its recovery, a flood time to see KV come back
                if left > (C.RECOVER_WITHIN_S + 15 if kind in ("stub", "tp") else 30):
                    if self._inject(kind):
                        injected.add(kind)
                        i += 1
                        next_fault = time.monotonic() + a.fault_every_s
                    else:  # not injected (e.g. the server was not serving): try again a little later
                        next_fault = time.monotonic() + 15
            self.stop_asked.wait(0.5)
        self.traffic_s = time.monotonic() - self.t_traffic0

    def _inject(self, kind: str) -> None:
        if kind == "stub":
            f = F.kill_llm_stub(self.ctx, self.server, self.watcher, self.rec)
        elif kind == "tp":
            f = F.kill_tp_worker(self.ctx, self.server, self.watcher, self.rec, self.repo.tp_model)
        else:
            f = F.flood(self.ctx, self.server, self.traffic, self.rec, self.repo.max_num_seqs, self.repo.max_waiting,
                        kv_baseline=self.kv_baseline.get("llm", 0.0),
                        serving=lambda: not any(x.open for x in self.watcher.incidents))
            if f.get("ok"):
                self.rec.event("note", f"flood: {f['completed']} completed, {f['refused']} refused "
                                       f"(>= {f['must_refuse_at_least']} needed), slowest refusal "
                                       f"{f['refusal_latency_max_s']} s, KV back {f['kv_back']}")
        if not f.get("ok"):
            self.rec.event("note", f"fault {kind} not injected: {f.get('error')}")
        self.faults.append(f)
        return bool(f.get("ok"))

    def _after_traffic(self, engines: list[str]) -> None:
        a = self.args
        self.rec.event("note", "traffic stopping")
        self.traffic.stop(timeout=a.timeout_s + 10)
        self.traffic_on = False
        t_stop = time.monotonic()
        for m in engines:
            met, secs, last = F.wait_kv(self.server.metrics_url, m, self.kv_baseline.get(m, 0.0),
                                        timeout=max(C.KV_BACK_WITHIN_S - (time.monotonic() - t_stop), 0.5))
            self.idle_end[m] = (met, time.monotonic() - t_stop, last)
        self.monitor.sample_now()
        for inc in self.watcher.incidents:
            if inc.open:
                self.watcher.close(inc, "still down at the end of the traffic")
        for part in (self.watcher, self.prober, self.monitor):  # what follows takes the server down
            part.hold(True)
        if "drain" in a.fault_kinds:
            self.drain_rec = F.drain(self.ctx, self.server, self.rec)
            self.faults.append(self.drain_rec)
            self.rec.event("note", f"drain: exit code {self.drain_rec.get('exit_code')}, readiness false after "
                                   f"{self.drain_rec.get('ready_false_after_s')} s, request during drain "
                                   f"{self.drain_rec.get('during_drain_http', {}).get('status')}")
        else:
            code = self.server.stop()
            self.rec.event("note", f"server stopped, launcher exit code {code}")

    def _overrun(self) -> None:
        print("soak: watchdog: the soak overran its bound; killing its server and exiting", flush=True)
        if self.server is not None:
            self.server.kill_all()
        os._exit(3)

    # ---- result

    def _finish(self) -> int:
        a = self.args
        outcomes, events = self.rec.snapshot()
        incidents = list(getattr(self, "watcher", None).incidents) if hasattr(self, "watcher") else []
        samples = self.monitor.snapshot() if hasattr(self, "monitor") else []
        t_last = time.monotonic()
        traffic0 = getattr(self, "t_traffic0", t_last)
        seen = {k: max(t, traffic0) for k, t in rss_fit.first_seen(samples).items()}
        exclude = [(f["t"], f["t"] + 60.0) for f in self.faults if "t" in f] + \
                  [(r["t"], r["t_ready"] + 60.0) for r in self.restarts]
        fits = rss_fit.fits(samples, seen, a.rss_warmup_s, exclude)
        kinds = rss_fit.fits_by_kind(samples, seen, a.rss_warmup_s, exclude)
        run = {"outcomes": outcomes, "events": events, "incidents": incidents, "restarts": self.restarts,
               "faults": self.faults, "enabled_faults": [FAULT_KINDS[k] for k in a.fault_kinds],
               "idle_end": self.idle_end, "drain": self.drain_rec, "samples": samples, "rss": fits,
               "rss_kinds": kinds,
               "rss_bound": a.rss_bound, "rss_step_bound": a.rss_step_bound, "t_last": t_last, "t0": self.rec.t0, "rel": lambda t: self.rec.rel(t) or 0.0,
               "kv_baseline": self.kv_baseline, "kv_start": self.kv_start, "traffic_s": getattr(self, "traffic_s", 0.0),
               "server_starts": self.server_starts, "config": {k: v for k, v in vars(a).items()}}
        run["windows"] = C.windows(incidents, self.restarts, t_last)
        checks = C.evaluate(run)
        if getattr(self, "aborted", None):
            checks.append(C.Check("soak ran to its end", False, self.aborted, [self.aborted]))
        if self.stop_asked.is_set() and not a.fail_fast:
            checks.append(C.Check("soak ran to its end", False, "interrupted", ["stopped by a signal"]))
        if getattr(self, "left_behind", []):
            checks.append(C.Check("no server process left behind", False, "", self.left_behind))
        run["checks"] = checks
        run["log_errors"] = log_errors(self.out)
        report = R.write(run, self.out)
        R.print_summary(report)
        print(f"\nreport: {self.out / 'report.json'}, plot: {self.out / 'soak.png'}")
        return 0 if report["passed"] else 1


LOG_LINE = re.compile(r"^E\d{4} |Traceback|Segmentation fault|SIGSEGV|SIGABRT|malloc\(\)|lock_exception|"
                      r"not healthy|core dumped|engine step failed|engine failed|WorkerFailure|killed by")


def log_errors(out: Path, limit: int = 60) -> list[str]:
    """Error lines of the server logs of this run (for the report)."""
    lines = []
    for p in sorted(out.glob("tritonserver.*.log")):
        try:
            for line in p.read_text(errors="replace").splitlines():
                if LOG_LINE.search(line) and "CudaDriverHelper" not in line and "CUDA driver" not in line:
                    lines.append(f"{p.name}: {line[:300]}")
        except OSError:
            continue
    return lines[:limit]


def main(argv=None) -> int:
    """Run one soak; returns the exit code (0 when every check passed)."""
    args = parse_args(argv)
    soak = Soak(args)

    def on_signal(signum, _frame):
        if soak.stop_asked.is_set():
            raise KeyboardInterrupt
        print(f"soak: {signal.Signals(signum).name}: stopping (again to abort)", flush=True)
        soak.stop_asked.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return soak.run()


if __name__ == "__main__":
    sys.exit(main())
