"""The pass criteria. `classify()` gives every request outcome an error kind and whether it was
expected; `evaluate()` turns the whole run into a list of `Check`s (the soak fails if any fails).

Expected: cancels the client made; INVALID_ARG naming the field for bad inputs (HTTP: 400); for the
flood, UNAVAILABLE naming the limit within 1 s; errors on requests that overlapped an injected
fault on an affected model when the message names what happened; anything during a restart the
soak had to do itself (that restart is already a failure: the server needed a person)."""

from __future__ import annotations

import dataclasses
import re

import rss as rss_fit

FAULT_WORDS = re.compile(
    r"not healthy|stub|killed|sigkill|engine fail|not serving|worker|unavailable|not ready|unknown model|"
    r"not found|unload|reload|restart|shutting down|draining|exited|died|crash", re.I)
UNREACHABLE = re.compile(r"Connection refused|failed to connect|RemoteDisconnected|Response ended prematurely|"
                         r"Connection reset|Socket closed|GOAWAY|Connection aborted|connection closed by the server", re.I)
ENGINE_REPORTED = re.compile(r"^engine failure:|WorkerFailure|engine step failed", re.I)
LIMIT_WORDS = ("max_num_waiting", "max_waiting_requests")
# Triton 2.51's generate endpoints answer every error of a decoupled model with 400
# (docs/operations/limits.md): an UNAVAILABLE refusal is 400 there with the refusal's own message, 503 on a Triton
# whose endpoints pass the code on
HTTP_UNAVAILABLE = (400, 503)
DRAIN_WORDS = re.compile(r"shutting down and takes no new requests", re.I)
RECOVER_WITHIN_S = 30.0
READY_LAG_S = 5.0       # a dead part must show in readiness within this
# readiness 200 up to this long before a probe was sent that then succeeded is not "ready while down":
# probes go out every second while an incident is open, and a failed one takes up to a second or two
PROBE_SLACK_S = 3.0
KV_BACK_WITHIN_S = 10.0
REFUSE_WITHIN_S = 1.0
DRAIN_READY_FALSE_S = 1.0


@dataclasses.dataclass
class Check:
    """One pass criterion: its name, whether it passed, a one-line detail and the failures (strings)."""
    name: str
    ok: bool
    detail: str = ""
    failures: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Window:
    """A stretch during which errors on `models` may be expected."""

    start: float
    end: float
    models: list
    why: str
    anything: bool = False  # a restart by the soak: every error is a consequence
    server_restart: bool = False  # tritonserver exited in it: a closed connection is a consequence


def windows(incidents, restarts, t_last: float) -> list[Window]:
    """The expected-error windows (seconds, monotonic clock) of the incidents and of the soak's
    restarts; an incident still open ends at t_last."""
    out = []
    for inc in incidents:
        end = inc.closed_at if inc.closed_at is not None else t_last
        out.append(Window(inc.t_open - 1.0, end + 5.0, list(inc.affected), inc.what,
                          server_restart=inc.server_exited_at is not None))
    for r in restarts:
        out.append(Window(r["t"] - 1.0, r["t_ready"] + 5.0, ["*"], "restart by the soak", anything=True))
    return out


def classify(o, wins: list[Window]) -> tuple[str, bool]:
    """(kind, expected) of one outcome."""
    if o.problems:
        return "malformed", False
    if o.status == "stall":
        return "stall", False
    if o.scenario == "flood":  # judged as a whole by the flood check
        if o.status == "ok":
            return "ok", True
        named = any(w in (o.error or "") for w in LIMIT_WORDS)
        return ("unavailable", True) if named else ("flood_error", False)
    if o.scenario == "drain_stream":  # judged by the drain checks
        return ("ok", True) if o.status == "ok" else ("drain_error", False)
    overlapping = [w for w in wins if o.t_send <= w.end and (o.t_end or o.t_send) >= w.start
                   and ("*" in w.models or o.model in w.models)]
    if o.expect.startswith("http:"):  # a refusal by status: 401 without the API key, 403 admin APIs
        if o.http_status == int(o.expect[5:]):
            return "refused_as_designed", True
        if o.status == "ok" or o.http_status == 200:
            return "guard_open", False
        # a server-level request: any incident's window explains a connection the restart closed
        anywhere = [w for w in wins if o.t_send <= w.end and (o.t_end or o.t_send) >= w.start]
        if o.status == "error" and anywhere:
            return _fault_kind(o, anywhere)
        return "wrong_refusal", False
    if o.expect.startswith("invalid_arg:"):
        field = o.expect.split(":", 1)[1]
        if o.status == "error" and field in (o.error or "") and (o.protocol not in ("http", "openai")
                                                                 or o.http_status == 400):
            return "invalid_arg", True
        if o.status == "ok":
            return "bad_input_accepted", False
        if o.status == "error" and overlapping:
            return _fault_kind(o, overlapping)
        return "invalid_arg_unnamed", False
    if o.status == "ok":
        return "ok", True
    if o.status == "cancelled":
        return "cancelled", True
    if overlapping:
        return _fault_kind(o, overlapping)
    if UNREACHABLE.search(o.error or "") and not ENGINE_REPORTED.search(o.error or ""):
        return "server_unreachable", False
    return "unexpected_error", False


def _fault_kind(o, wins) -> tuple[str, bool]:
    if any(w.anything for w in wins):
        return "restart", True
    if ENGINE_REPORTED.search(o.error or ""):
        # an error response the engine sent naming its failure; its text may quote a transport error of
        # its own (a TP rank's gloo "Connection reset by peer"), which is not this client's connection
        return "fault", True
    if UNREACHABLE.search(o.error or ""):
        # the server process is gone: a consequence when it went during the incident (a supervisor
        # restarting tritonserver after a stub died closes every connection), else a crash
        return ("server_restart", True) if any(w.server_restart for w in wins) else ("server_unreachable", False)
    if FAULT_WORDS.search(o.error or ""):
        return "fault", True
    if any(w in (o.error or "") for w in LIMIT_WORDS):
        # the clients' backlog while the model was down meets the waiting limit once it is back: a
        # refusal naming the limit is the designed answer (outside a fault window it is unexpected)
        return "unavailable", True
    return "fault_unnamed", False


def _examples(outs, n=5) -> list[str]:
    return [f"{o.scenario} {o.model}/{o.protocol} {o.request_id}: {o.status}: "
            f"{(o.error or '; '.join(o.problems))[:300]}" for o in outs[:n]]


def evaluate(run: dict) -> list[Check]:
    """run: outcomes, incidents, restarts, faults (records of faults.py), enabled_faults, idle_end,
    drain, samples, rss (fits), rss_bound, t_last."""
    checks: list[Check] = []
    # the flood's and the drain's requests have checks of their own
    outs = [o for o in run["outcomes"] if o.scenario not in ("flood", "drain_stream")]
    wins = windows(run["incidents"], run["restarts"], run["t_last"])
    kinds: dict[str, list] = {}
    for o in outs:
        kind, expected = classify(o, wins)
        kinds.setdefault(kind, []).append((o, expected))
    bad = {k: [o for o, e in v if not e] for k, v in kinds.items()}
    bad = {k: v for k, v in bad.items() if v}

    mal = bad.pop("malformed", [])
    checks.append(Check("responses well-formed", not mal, f"{len(mal)} malformed", _examples(mal)))
    groups: dict = {}
    for o in outs:
        if o.ref_key and o.status == "ok" and not o.problems:
            groups.setdefault(o.ref_key, []).append(o)
    differ = [g for g in groups.values() if len({o.text for o in g}) > 1]
    repeated = sum(len(g) > 1 for g in groups.values())
    checks.append(Check("same greedy request, same text (streamed deltas join to the non-streamed text)", not differ,
                        f"{repeated} requests repeated across protocols / streaming, {len(differ)} differ",
                        [" vs ".join(f"{o.scenario}/{o.protocol} {o.text[:80]!r}" for o in g[:3]) for g in differ[:5]]))
    stall = bad.pop("stall", [])
    checks.append(Check("no stalled request", not stall,
                        f"{len(stall)} requests got no response for the stall bound or hit their time-out",
                        _examples(stall)))
    flat = [o for v in bad.values() for o in v]
    checks.append(Check("no unexpected error", not flat,
                        ", ".join(f"{k} {len(v)}" for k, v in sorted(bad.items())) or "none", _examples(flat, 8)))

    served = {}
    for o in outs:
        if o.status == "ok" and not o.problems:
            served[(o.model, o.protocol)] = served.get((o.model, o.protocol), 0) + 1
    need = [(m, p) for m in ("ensemble", "llm") for p in ("grpc", "http")]
    if any(o.protocol == "openai" for o in outs):
        need.append(("llm", "openai"))
    missing = [f"{m}/{p}" for m, p in need if not served.get((m, p))]
    checks.append(Check("traffic served on both models and protocols", not missing,
                        ", ".join(f"{m}/{p} {n}" for (m, p), n in sorted(served.items())),
                        [f"no request completed on {x}" for x in missing]))

    # parts that died without a fault, or stopped answering
    spont = [i for i in run["incidents"] if not i.injected]
    checks.append(Check("no crash, wedge or unhealthy engine without an injected fault", not spont,
                        f"{len(spont)} incidents", [f"{i.kind} at +{run['rel'](i.t_open):.0f}s: {i.what}" for i in spont]))
    for inc in run["incidents"]:
        _incident_checks(checks, inc, run, outs)

    # each enabled fault ran
    ran = {}
    for f in run["faults"]:
        ran.setdefault(f["kind"], []).append(f)
    not_run = [k for k in run["enabled_faults"] if not any(f.get("ok") for f in ran.get(k, []))]
    checks.append(Check("every enabled fault injected", not not_run, ", ".join(f"{k} x{len(v)}" for k, v in ran.items()),
                        [f"{k} not injected: {[f.get('error') for f in ran.get(k, [])] or 'never scheduled'}"
                         for k in not_run]))
    for f in ran.get("flood", []):
        if f.get("ok"):
            _flood_check(checks, f, run)

    for model, (met, secs, last) in run["idle_end"].items():
        checks.append(Check(f"KV blocks of {model} back to the idle baseline within {KV_BACK_WITHIN_S:.0f} s "
                            f"after traffic stopped",
                            met, f"{secs:.1f} s; last gauges {last}",
                            [] if met else [f"{model}: {last} after {secs:.1f} s (baseline {run['kv_baseline'].get(model)})"]))
    if run.get("drain") is not None:
        _drain_checks(checks, run["drain"])
    elif "drain" in run["enabled_faults"]:
        checks.append(Check("drain", False, "not run", ["the drain did not run"]))

    bound = run["rss_bound"]
    kinds = run["rss_kinds"]
    over = [f"{name}: {r['slope_mb_per_min']:+.2f} MB/min pooled over {r['lifetimes']} lifetimes, "
            f"{r['segments']} stretches, {r['span_s']:.0f} s" for name, r in kinds.items()
            if r["judged"] and r["slope_mb_per_min"] > bound]
    over += [f"{r['name']} (pid {k.split('#')[1]}): {r['slope_mb_per_min']:+.2f} MB/min over {r['span_s']:.0f} s "
             f"in {r['segments']} stretches between faults ({r['start_mb']} -> {r['end_mb']} MB)"
             for k, r in run["rss"].items() if r["judged"] and r["slope_mb_per_min"] > bound]
    judged_kinds = sum(r["judged"] for r in kinds.values())
    judged = sum(r["judged"] for r in run["rss"].values())
    checks.append(Check(f"RSS trend of every process kind and long lifetime <= {bound} MB/min", not over,
                        f"{judged_kinds} of {len(kinds)} process kinds and {judged} of {len(run['rss'])} "
                        f"lifetimes long enough to judge", over))
    step_bound = run.get("rss_step_bound", rss_fit.DEFAULT_STEP_BOUND_MB)
    stepped = [f"{r['name']} (pid {k.split('#')[1]}): {r['steps_mb']:.1f} MB of level shifts across "
               f"{r['segments'] - 1} fault windows" for k, r in run["rss"].items()
               if r["steps_judged"] and r["steps_mb"] > step_bound]
    checks.append(Check(f"RSS kept across faults by every process <= {step_bound} MB", not stepped,
                        f"largest {max([r['steps_mb'] for r in run['rss'].values() if r['steps_judged']] or [0.0]):.1f} MB",
                        stepped))
    return checks


def _in_flight_at(outs, t: float, models) -> list:
    return [o for o in outs if o.t_send < t < (o.t_end or t + 1) and o.model in models]


def _incident_checks(checks, inc, run, outs) -> None:
    rel = run["rel"]
    label = f"{inc.what} at +{rel(inc.t_open):.0f}s"
    took = None if inc.recovered_at is None else inc.recovered_at - inc.t_open
    checks.append(Check(f"serving again within {RECOVER_WITHIN_S:.0f} s: {label}",
                        took is not None and took <= RECOVER_WITHIN_S,
                        "not recovered" + (f" ({inc.closed_how})" if inc.closed_how else "") if took is None else f"{took:.1f} s",
                        [] if took is not None and took <= RECOVER_WITHIN_S else
                        [f"{', '.join(inc.affected)} not serving {RECOVER_WITHIN_S:.0f} s after: {label}"
                         + (f" (took {took:.1f} s)" if took else "; the server needed a person")]))
    fails = []
    if inc.ready_false_at is None or inc.ready_false_at - inc.t_open > READY_LAG_S:
        fails.append(f"readiness still 200 {READY_LAG_S:.0f} s after {label}"
                     + ("" if inc.ready_false_at is None else f" (false only after {inc.ready_false_at - inc.t_open:.1f} s)"))
    # readiness may return a moment before the next probe proves the model serves again; the proof dates
    # from when that probe was sent, not from its answer (under the backlog of clients that resume at
    # once after a restart, a 1-token probe can take seconds to be answered by a model that took it)
    serving_from = getattr(inc, "serving_from", None) or inc.recovered_at
    early = [t for t in inc.ready_200_while_down if serving_from is None or t < serving_from - PROBE_SLACK_S]
    if early:
        a, b = early[0], early[-1]
        fails.append(f"/v2/health/ready and /v2/models/{inc.model}/ready answered 200 while {inc.model} was down "
                     f"({len(early)} polls, +{rel(a):.0f}s..+{rel(b):.0f}s)")
    checks.append(Check(f"not ready while down: {label}", not fails, "", fails))
    if inc.injected:
        flight = _in_flight_at(outs, inc.t_open, inc.affected)
        # a request on the dead stub itself has nothing left to answer it in the server: when tritonserver
        # is restarted its connection closes (gRPC UNAVAILABLE, HTTP stream cut before its end)
        restarted = inc.server_exited_at is not None
        closed = [o for o in flight if restarted and o.status == "error" and UNREACHABLE.search(o.error or "")]
        unclear = [o for o in flight if o not in closed and (o.status == "stall" or (
            o.status == "error" and not FAULT_WORDS.search(o.error or "")))]
        checks.append(Check(f"requests in flight end with a clear error: {label}", not unclear,
                            f"{len(flight)} in flight: " + ", ".join(sorted({o.status for o in flight}))
                            + (f"; {len(closed)} closed by the server's restart" if closed else ""),
                            _examples(unclear)))


def _flood_check(checks, f, run) -> None:
    fails = []
    if f["refused"] < f["must_refuse_at_least"]:
        fails.append(f"only {f['refused']} of {f['requests']} refused; at least {f['must_refuse_at_least']} are past "
                     f"max_num_seqs + the waiting limit")
    if f["refusals_named"] < f["refused"]:
        fails.append(f"{f['refused'] - f['refusals_named']} refusals do not name the limit ({' / '.join(LIMIT_WORDS)})")
    if f["refused"] and f["refusal_latency_max_s"] > REFUSE_WITHIN_S:
        fails.append(f"a refusal took {f['refusal_latency_max_s']:.2f} s (bound {REFUSE_WITHIN_S:.0f} s)")
    if f["http_refusal_statuses"] and not set(f["http_refusal_statuses"]) <= set(HTTP_UNAVAILABLE):
        fails.append(f"HTTP refusals answered {f['http_refusal_statuses']}, not {' or '.join(map(str, HTTP_UNAVAILABLE))} "
                     f"(UNAVAILABLE)")
    if f["other"]:
        fails.append(f"flood requests neither completed nor refused: {f['other'][:3]}")
    if not f["kv_back"]:
        fails.append(f"KV not back to baseline {KV_BACK_WITHIN_S:.0f} s after the flood: {f['kv_after']}")
    checks.append(Check(f"flood at +{run['rel'](f['t']):.0f}s: past the limit UNAVAILABLE within "
                        f"{REFUSE_WITHIN_S:.0f} s, the others complete, KV back", not fails,
                        f"{f['requests']} sent, {f['completed']} completed, {f['refused']} refused "
                        f"(>= {f['must_refuse_at_least']} needed), slowest refusal {f['refusal_latency_max_s']} s",
                        fails))


def _drain_checks(checks, d) -> None:
    bad = [s for s in d["streams"] if s["status"] != "ok"]
    checks.append(Check("drain: the 4 streams in flight at SIGTERM complete normally",
                        not bad and d.get("all_in_flight", False),
                        "; ".join(f"{s['model']} {s['status']}" for s in d["streams"]),
                        [f"{s['model']}: {s['status']} after {s['responses']} responses: {(s['error'] or '')[:200]}"
                         for s in bad] + ([] if d.get("all_in_flight") else ["not all 4 streams were in flight"])))
    rf = d.get("ready_false_after_s")
    checks.append(Check(f"drain: readiness false within {DRAIN_READY_FALSE_S:.0f} s of SIGTERM",
                        rf is not None and rf <= DRAIN_READY_FALSE_S, f"{rf} s",
                        [] if rf is not None and rf <= DRAIN_READY_FALSE_S else
                        [f"/v2/health/ready still 200 {DRAIN_READY_FALSE_S:.0f} s after SIGTERM" if rf is None or rf > 5
                         else f"readiness false only after {rf:.2f} s"]))
    h = d.get("during_drain_http", {})
    refused = h.get("status") in HTTP_UNAVAILABLE and bool(DRAIN_WORDS.search(h.get("body", "") or ""))
    checks.append(Check("drain: a request sent during the drain gets UNAVAILABLE (the drain's refusal)", refused,
                        f"HTTP {h.get('status')} after {h.get('seconds')} s",
                        [] if refused else [f"got {h.get('status')}: {h.get('body', '')[:200]}"]))
    checks.append(Check("drain: the launcher exits 0", d.get("exit_code") == 0,
                        f"exit code {d.get('exit_code')} after {d.get('exit_after_s')} s",
                        [] if d.get("exit_code") == 0 else
                        [f"exit code {d.get('exit_code')}"
                         + (" (killed by the soak after its bound)" if d.get("killed_by_soak") else "")]))
