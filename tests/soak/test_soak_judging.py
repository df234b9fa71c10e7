"""The soak's judging without a server: how outcomes are classified (expected or not), the RSS
slope fit, and the response validation of one request."""

from __future__ import annotations

import threading
import time

import checks
import proctree
import watch
import rss
from records import Outcome
from validate import Resp, Spec, check_responses


def _o(status="error", error=None, expect="ok", model="llm", protocol="grpc", t=(10.0, 12.0), **kw):
    o = Outcome("s", model, protocol, "c", "id", expect=expect, t_send=t[0], t_end=t[1], status=status, error=error)
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def test_bad_input_must_name_the_field_and_be_400_over_http():
    assert checks.classify(_o(error="sampling_parameters.top_p: must be in (0, 1]", expect="invalid_arg:top_p"), []) \
        == ("invalid_arg", True)
    assert checks.classify(_o(error="something went wrong", expect="invalid_arg:top_p"), [])[1] is False
    assert checks.classify(_o(error="top_p: bad", expect="invalid_arg:top_p", protocol="http", http_status=500), [])[1] \
        is False
    assert checks.classify(_o(status="ok", expect="invalid_arg:top_p"), []) == ("bad_input_accepted", False)


def test_errors_are_expected_only_in_a_fault_window_of_their_model_and_when_they_say_what_happened():
    win = [checks.Window(11.0, 20.0, ["llm", "ensemble"], "SIGKILL of stub llm_0_0")]
    named = _o(error="Stub process 'llm_0_0' is not healthy.")
    assert checks.classify(named, win) == ("fault", True)
    assert checks.classify(named, []) == ("unexpected_error", False)
    assert checks.classify(_o(error="Internal error"), win) == ("fault_unnamed", False)
    busy = _o(error="server busy: 8 requests waiting (max_num_waiting 8); retry later")
    assert checks.classify(busy, win) == ("unavailable", True)
    assert checks.classify(busy, []) == ("unexpected_error", False)
    assert checks.classify(_o(error="Stub process 'llm_0_0' is not healthy.", model="llm_tp2"), win)[1] is False
    assert checks.classify(_o(status="stall", error="no response for 30 s"), win) == ("stall", False)
    restart = [checks.Window(11.0, 20.0, ["*"], "restart by the soak", anything=True)]
    assert checks.classify(_o(error="Socket closed"), restart) == ("restart", True)


def test_a_closed_connection_is_expected_only_when_tritonserver_exited_in_the_window():
    cut = _o(error="ChunkedEncodingError: Response ended prematurely", protocol="http")
    fault = checks.Window(11.0, 20.0, ["llm", "ensemble"], "SIGKILL of stub llm_0_0")
    assert checks.classify(cut, [fault]) == ("server_unreachable", False)
    restarted = checks.Window(11.0, 20.0, ["llm", "ensemble"], "SIGKILL of stub llm_0_0", server_restart=True)
    assert checks.classify(cut, [restarted]) == ("server_restart", True)
    assert checks.classify(cut, []) == ("server_unreachable", False)
    raw = _o(error="connection closed by the server: b''", protocol="http")  # a raw-socket client's words
    assert checks.classify(raw, [restarted]) == ("server_restart", True)


def test_guard_probes_must_be_refused_with_their_status():
    """401 without the API key and 403 for Triton's admin APIs are the design; a 200 means the guard is
    open; a connection a tritonserver restart closed is explained by any incident (a server-level
    probe belongs to no model)."""
    assert checks.classify(_o(error="HTTP 403: restricted", expect="http:403", model="triton", protocol="http",
                              http_status=403), []) == ("refused_as_designed", True)
    assert checks.classify(_o(status="ok", expect="http:401", protocol="openai", http_status=200), []) \
        == ("guard_open", False)
    assert checks.classify(_o(error="HTTP 500: boom", expect="http:401", protocol="openai", http_status=500), [])[1] \
        is False
    refused = _o(error="ConnectionError: [Errno 111] Connection refused", expect="http:403", model="triton",
                 protocol="http")
    restarted = checks.Window(11.0, 20.0, ["llm", "ensemble"], "SIGKILL of stub llm_0_0", server_restart=True)
    assert checks.classify(refused, [restarted]) == ("server_restart", True)
    assert checks.classify(refused, []) == ("wrong_refusal", False)


def test_an_engine_failure_quoting_a_rank_transport_error_is_the_fault_not_a_closed_connection():
    """Seen in a 2-hour soak: the surviving TP rank's gloo error reached the client inside the engine's
    own error response; the server had not closed any connection."""
    tp = checks.Window(11.0, 20.0, ["llm_tp2"], "SIGKILL of tp_worker:llm_tp2_0_0:1")
    err = _o(model="llm_tp2", error="engine failure: WorkerFailure: tensor-parallel worker rank 0 (cpu) failed "
                                    "(step): RuntimeError: [pair.cc:576] Read error [127.0.0.1]:41180: "
                                    "Connection reset by peer")
    assert checks.classify(err, [tp]) == ("fault", True)
    assert checks.classify(err, []) == ("unexpected_error", False)  # outside a fault window: still unexpected


class _Rec:
    def __init__(self):
        self.events = []

    def event(self, kind, what, t=None, model=None):
        self.events.append((kind, what))


class _Prober:
    def __init__(self):
        self.hurry = threading.Event()


class _Server:
    def __init__(self, procs):
        self.procs = procs

    def processes(self):
        return self.procs


def _watcher(procs):
    w = watch.Watcher(lambda: None, _Prober(), _Rec(), ["llm", "ensemble", "llm_tp2"])
    srv = _Server(procs)
    w._check_processes(srv, 100.0)
    return w, srv


def _proc(pid, role, name):
    return proctree.Proc(pid, 1, 1, role, name)


SERVER = [_proc(1, "tritonserver", "tritonserver"), _proc(2, "stub", "stub:llm_0_0"),
          _proc(3, "stub", "stub:postprocessing_0_0"), _proc(4, "stub", "stub:readiness_gate_a_0_0")]


def test_stubs_a_restarted_tritonserver_takes_belong_to_the_fault_that_made_it_restart():
    w, srv = _watcher(SERVER)
    fault = w.open_incident("fault", "SIGKILL of stub llm_0_0", "llm", injected=True, t=100.2)
    srv.procs = SERVER[:1] + SERVER[3:]  # the supervisor stops the stubs first, then tritonserver
    w._check_processes(srv, 100.5)
    srv.procs = []
    w._check_processes(srv, 101.0)
    w._check_processes(srv, 105.0)  # past the grace: nothing left to judge
    assert [i.kind for i in w.incidents] == ["fault"]
    assert fault.affected == ["llm", "ensemble", "llm_tp2"] and fault.server_exited_at == 101.0


def test_a_stub_that_exits_alone_is_a_crash_affecting_what_depends_on_it():
    w, srv = _watcher(SERVER)
    srv.procs = [p for p in SERVER if p.pid != 3]
    w._check_processes(srv, 100.5)
    assert w.incidents == []  # judged after the grace, in case tritonserver follows
    w._check_processes(srv, 104.0)
    assert [(i.kind, i.model, i.affected) for i in w.incidents] == [("crash", "postprocessing", ["ensemble"])]
    w, srv = _watcher(SERVER)
    srv.procs = [p for p in SERVER if p.pid != 4]  # a readiness gate holds the whole server's readiness
    w._check_processes(srv, 100.5)
    w._check_processes(srv, 104.0)
    assert [(i.kind, i.affected) for i in w.incidents] == [("crash", ["llm", "ensemble", "llm_tp2"])]


def test_flood_refusals_must_name_the_limit():
    ok = _o(error="server busy: 8 requests already waiting (max_waiting_requests); retry later")
    ok.scenario = "flood"
    assert checks.classify(ok, []) == ("unavailable", True)
    bad = _o(error="Internal error")
    bad.scenario = "flood"
    assert checks.classify(bad, []) == ("flood_error", False)


def test_rss_slope_is_fitted_after_the_warm_up():
    warm = [(t, 100.0 + 10 * t / 60) for t in range(0, 300, 15)]       # +10 MB/min while warming up
    flat = [(t, 150.0 + 0.05 * ((t // 15) % 2)) for t in range(300, 900, 15)]  # then flat with noise
    r = rss.fit(warm + flat, first_seen=0.0, warmup_s=300.0)
    assert r["points"] == len(flat) and abs(r["slope_mb_per_min"]) < 0.05
    leak = [(t, 150.0 + 2.0 * t / 60) for t in range(300, 900, 15)]
    assert abs(rss.fit(leak, 0.0, 300.0)["slope_mb_per_min"] - 2.0) < 1e-6
    assert rss.fit(leak, 0.0, 300.0, exclude=[(300.0, 899.0)])["points"] == 0


def test_rss_step_in_a_fault_window_is_a_level_shift_not_a_trend():
    # The 2-hour soak's llm stub: flat, a 6.3 MB step 12-42 s after a flood at t=900, flat again.
    # A straight line through all of it fits ~0.7 MB/min; the per-segment fit sees no trend.
    pts = [(t, 200.0 + 0.05 * ((t // 15) % 2) + (6.3 if t >= 930 else 0.0)) for t in range(300, 1800, 15)]
    r = rss.fit(pts, first_seen=0.0, warmup_s=300.0, exclude=[(900.0, 960.0)])
    assert r["segments"] == 2 and r["line_slope_mb_per_min"] > 0.3
    assert abs(r["slope_mb_per_min"]) < 0.05 and abs(r["steps_mb"] - 6.3) < 0.1
    # The same step outside any fault window is inside a segment: it tilts the trend.
    assert rss.fit(pts, 0.0, 300.0)["slope_mb_per_min"] > 0.3


def test_rss_released_once_inside_a_stretch_is_not_memory_kept_across_faults():
    # The 20-minute soak's OpenAI frontend: flat at 179 MB, down to 145 MB once between two faults,
    # flat again. The pooled slope tilts down and the intercepts rise 30 MB; nothing was kept.
    pts = [(t, 179.0 if t < 570 else 145.0) for t in range(60, 1215, 15)]
    r = rss.fit(pts, first_seen=0.0, warmup_s=60.0, exclude=[(136.0, 200.0), (436.0, 470.0), (1044.0, 1080.0)])
    assert r["segments"] == 4 and r["steps_mb"] == 0.0
    # memory kept at each of the same faults still counts: 5 MB at each, 15 MB in all
    kept = [(t, 179.0 + 5.0 * sum(t >= f for f in (200, 470, 1080))) for t in range(60, 1215, 15)]
    r = rss.fit(kept, first_seen=0.0, warmup_s=60.0, exclude=[(136.0, 200.0), (436.0, 470.0), (1044.0, 1080.0)])
    assert abs(r["steps_mb"] - 15.0) < 0.1


def test_rss_leak_per_request_shows_in_every_segment():
    # 1.5 MB/min of growth under traffic, faults every 300 s: the stretches between them still carry it.
    pts = [(t, 150.0 + 1.5 * t / 60) for t in range(300, 2400, 15)]
    faults = [(f, f + 60.0) for f in range(600, 2400, 300)]
    r = rss.fit(pts, 0.0, 300.0, exclude=faults)
    assert r["segments"] >= 5 and abs(r["slope_mb_per_min"] - 1.5) < 1e-6
    # The growth inside the windows is carried by the trend, not counted again as steps.
    assert r["steps_mb"] < 1e-6


def test_rss_kept_on_every_fault_adds_up_as_steps():
    # 3 MB kept per fault, flat between: no trend, but 7 shifts sum to 21 MB, over the 16 MB bound.
    faults = [(f, f + 60.0) for f in range(600, 2700, 300)]
    pts = [(t, 150.0 + 3.0 * sum(t > b for _, b in faults)) for t in range(300, 2700, 15)]
    pts = [p for p in pts if not any(a <= p[0] <= b for a, b in faults)]
    r = rss.fit(pts, 0.0, 300.0, exclude=faults)
    assert abs(r["slope_mb_per_min"]) < 1e-6
    assert abs(r["steps_mb"] - 3.0 * (r["segments"] - 1)) < 1e-6 and r["steps_mb"] > rss.DEFAULT_STEP_BOUND_MB


def test_rss_short_segments_are_dropped():
    pts = [(t, 100.0) for t in range(300, 1200, 15)]
    # a window every 40 s leaves segments of 1-2 points: nothing to fit
    faults = [(f, f + 10.0) for f in range(300, 1200, 40)]
    assert rss.fit(pts, 0.0, 0.0, exclude=faults)["points"] == 0


def _samples(lives: dict[str, list[tuple[float, float]]], step_s=15.0) -> list[dict]:
    """Monitor samples from {process key: [(t, rss_mb)]}, all under traffic."""
    by_t: dict[float, dict] = {}
    for key, pts in lives.items():
        for t, v in pts:
            by_t.setdefault(t, {})[key] = {"rss_mb": v}
    return [{"t": t, "traffic": True, "rss": r} for t, r in sorted(by_t.items())]


def _rss_checks(samples, exclude=()):
    seen = rss.first_seen(samples)
    run = {"rss": rss.fits(samples, seen, 300.0, list(exclude)),
           "rss_kinds": rss.fits_by_kind(samples, seen, 300.0, list(exclude)),
           "rss_bound": rss.DEFAULT_BOUND_MB_PER_MIN, "rss_step_bound": rss.DEFAULT_STEP_BOUND_MB}
    # only the two RSS checks of evaluate(), on a run with nothing else in it
    out = [c for c in checks.evaluate({**run, "outcomes": [], "incidents": [], "restarts": [], "faults": [],
                                       "enabled_faults": [], "idle_end": {}, "drain": None, "samples": samples,
                                       "t_last": 10_000.0, "rel": lambda t: t})
           if c.name.startswith("RSS")]
    assert len(out) == 2
    return run, out


def _life(t0, t1, f, every=15):
    return [(float(t), f(t - t0)) for t in range(t0, t1, every)]


def test_rss_early_growth_of_one_short_lifetime_is_outweighed_by_the_other_lifetimes_of_its_kind():
    # The third 2-hour run: llm stubs lived ~15 min (every stub kill restarted the server). One grew
    # 1.1 MB/min over its single 8-minute stretch after the warm-up (~9 MB, then it was killed); the
    # others were flat. Judged alone that lifetime reads over the bound; the kind's pooled trend does not.
    lives = {"llm stub#100": _life(0, 780, lambda s: 2000 + 1.1 * s / 60)}
    for i, t0 in enumerate(range(900, 900 * 6, 900)):
        lives[f"llm stub#{101 + i}"] = _life(t0, t0 + 780, lambda s: 2000 + 0.05 * ((s // 15) % 2))
    samples = _samples(lives)
    run, (trend, steps) = _rss_checks(samples)
    alone = run["rss"]["llm stub#100"]
    assert alone["slope_mb_per_min"] > rss.DEFAULT_BOUND_MB_PER_MIN and not alone["judged"]
    kind = run["rss_kinds"]["llm stub"]
    assert kind["judged"] and kind["lifetimes"] == 6 and kind["slope_mb_per_min"] < 0.3
    assert trend.ok and steps.ok


def test_rss_leak_in_every_short_lifetime_fails_the_kind():
    # 1.2 MB/min in every 13-minute lifetime: no lifetime is long enough alone, the kind's trend fails.
    lives = {f"llm stub#{100 + i}": _life(t0, t0 + 780, lambda s: 2000 + 1.2 * s / 60)
             for i, t0 in enumerate(range(0, 900 * 6, 900))}
    run, (trend, _) = _rss_checks(_samples(lives))
    assert not any(r["judged"] for r in run["rss"].values())
    assert abs(run["rss_kinds"]["llm stub"]["slope_mb_per_min"] - 1.2) < 1e-6
    assert not trend.ok and "llm stub" in trend.failures[0]


def test_rss_leak_of_one_long_lifetime_fails_even_when_other_lifetimes_of_its_kind_are_flat():
    # A lifetime long enough to judge alone (30 min of stretches) with a 1.5 MB/min leak fails on its
    # own, though the pooled trend over it and many short flat lifetimes may stay under the bound.
    lives = {"ensemble stub#1": _life(0, 2100, lambda s: 70 + 1.5 * s / 60)}
    for i, t0 in enumerate(range(2100, 2100 + 900 * 8, 900)):
        lives[f"ensemble stub#{2 + i}"] = _life(t0, t0 + 780, lambda s: 70.0)
    run, (trend, _) = _rss_checks(_samples(lives))
    assert run["rss"]["ensemble stub#1"]["judged"]
    assert not trend.ok and any("pid 1" in f for f in trend.failures)


def test_validation_of_llm_stream_finish_reasons_and_counts():
    spec = Spec("llm", max_tokens=3, stream=True, finish_reason=True)
    good = [Resp(0, "a", "None", 1), Resp(1, "b", "None", 1), Resp(2, "c", "length", 1)]
    assert check_responses(spec, good, complete=True) == []
    early = [Resp(0, "a", "stop", 1), Resp(1, "b", "length", 1)]
    assert any("before the end" in p for p in check_responses(spec, early, complete=True))
    short = [Resp(0, "a", "None", 1), Resp(1, "b", "length", 1)]
    assert any("finish_reason length after 2 tokens" in p for p in check_responses(spec, short, complete=True))
    guided = Spec("llm", max_tokens=10, stream=True, finish_reason=True, guided_json=True)
    assert check_responses(guided, [Resp(0, '{"a": ', "None", 1), Resp(1, "1}", "stop", 1)], True) == []
    assert any("does not parse" in p for p in check_responses(guided, [Resp(0, '{"a": ', "stop", 1)], True))


def test_readiness_is_judged_against_when_the_first_good_probe_was_sent_not_answered():
    def judged(serving_from, recovered_at, polls):
        inc = watch.Incident("fault", "SIGKILL of stub llm_0_0", "llm", ["llm"], t_open=100.0, injected=True,
                             ready_false_at=100.1, ready_200_while_down=polls,
                             recovered_at=recovered_at, serving_from=serving_from)
        out = []
        checks._incident_checks(out, inc, {"rel": lambda t: t}, [])
        return next(c for c in out if c.name.startswith("not ready while down"))
    # the 2-hour soak's case: 200 from +11.0 s; a probe sent at +11.2 s that the model took was answered at +14.2 s
    assert judged(111.2, 114.2, [111.0, 111.5, 112.0, 113.0, 114.0]).ok
    # 200 while no request sent for seconds afterwards could be served: a lie to the load balancer
    bad = judged(120.0, 120.5, [111.0, 111.5, 120.0])
    assert not bad.ok and "2 polls" in bad.failures[0]
    assert not judged(None, None, [111.0]).ok  # never recovered


class _Recorder:
    def __init__(self):
        self.outs = []

    def add(self, out):
        self.outs.append(out)

    def event(self, *a, **k):
        pass


def test_no_client_starts_a_request_after_pause_returned_with_none_in_flight():
    import traffic as T
    started_after_pause = []
    paused_at = []

    def kind_run(ctx, name, rng, model):
        if paused_at and paused_at[-1][1] is None:
            started_after_pause.append(name)  # pause() returned (in flight 0) and is not resumed yet
        time.sleep(0.001)
        return Outcome("k", model, "grpc", name, "-", t_send=0.0, t_end=0.0, status="ok")

    tr = T.Traffic(T.Context(5.0, 5.0), _Recorder(), clients=6, kinds=[T.Kind("k", 1.0, kind_run, ("llm",))], seed=1)
    tr.start()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert tr.pause(timeout=2.0)
        paused_at.append([time.monotonic(), None])
        time.sleep(0.02)  # any client past the go flag without being counted would start now
        paused_at[-1][1] = time.monotonic()
        tr.resume()
        time.sleep(0.005)
    assert tr.stop(timeout=5.0)
    assert len(paused_at) > 50 and started_after_pause == []


def test_a_non_streamed_grpc_request_is_bounded_by_its_time_out_not_the_stall_bound():
    """Its one response comes when the generation ends (as HTTP `generate`'s): waiting longer than
    the stall bound for it is not a stall; a stream's silence is."""
    import types

    import grpc_requests
    from streams import StreamTimeout

    class Silent:
        def __init__(self):
            self.waits = []

        def next(self, timeout):
            self.waits.append(timeout)
            raise StreamTimeout()

    ctx = types.SimpleNamespace(stall_s=30.0, timeout_s=120.0)
    for stream, first_wait, message in ((True, 30.0, "no response for 30 s after 0 responses"),
                                        (False, 120.0, "not finished within the 120 s time-out")):
        payload = types.SimpleNamespace(spec=types.SimpleNamespace(stream=stream, model="ensemble"))
        out = Outcome("grpc_x", "ensemble", "grpc", "c0", "id")
        out.t_send = time.monotonic()
        s = Silent()
        assert grpc_requests._read(ctx, s, out, payload, [], []) is False
        assert out.status == "stall" and out.error == message, (stream, out.error)
        assert abs(s.waits[0] - first_wait) < 1.0, s.waits
