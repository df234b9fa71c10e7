"""The injected faults, each a function returning a plain dict of what was done and seen:

- kill_llm_stub: SIGKILL of the Python-backend stub of instance llm_0_0 (an incident opens; the
  watcher measures recovery and readiness);
- kill_tp_worker: SIGKILL of one tensor-parallel worker (the last rank) of the TP model's stub;
- flood: traffic paused, then max_num_seqs + waiting limit + extra requests to `llm` at once
  (two thirds gRPC streams, one third HTTP generate); past the limit each must be refused with
  UNAVAILABLE naming the limit within 1 s, the others must complete; KV back to baseline after;
- drain: 4 streams in flight (2 llm, 2 ensemble), SIGTERM to the launcher, readiness must go false
  at once, a request sent during the drain must get the drain's UNAVAILABLE refusal, the 4 streams must
  complete normally and the launcher must exit 0.
Only processes of the soak's own server tree are signalled, by pid and start time."""

from __future__ import annotations

import json
import random
import signal
import threading
import time

import requests

import payloads
import proctree
from grpc_requests import _read
from monitor import engine_gauges
from records import Outcome
from streams import Stream

LIMIT_WORDS = ("max_num_waiting", "max_waiting_requests")
REFUSE_WITHIN_S = 1.0
KV_BACK_WITHIN_S = 10.0


def witnesses(ctx, recorder, models: list[str], max_tokens: dict | None = None, wait_s: float = 60.0) -> int:
    """One long stream per entry of `models`, each read on its own thread to its end and recorded
    (scenario "fault_witness"): requests surely in flight when a fault is injected. Returns once
    each has its first response (or after wait_s); the number that has."""
    rng = random.Random(len(recorder.outcomes))
    started = []

    def run(model, ev):
        p = payloads.make(model, rng, max_tokens=(max_tokens or {}).get(model), long=True)
        o = Outcome("fault_witness", model, "grpc", "fault", ctx.new_id())
        resps, problems = [], []
        ok = False
        try:
            s = Stream(ctx.grpc_url())
        except Exception as e:  # noqa: BLE001
            o.status, o.error, o.t_end = "error", f"connect: {e}", time.monotonic()
            recorder.add(o)
            ev.set()
            return
        try:
            o.t_send = s.send(model, p.grpc_inputs(), o.request_id)
            ok = _read(ctx, s, o, p, resps, problems, stop_after=1)
            ev.set()
            if not ok and o.error is None and o.status == "ok":
                ok = _read(ctx, s, o, p, resps, problems)
        except Exception as e:  # noqa: BLE001
            o.status, o.error = "error", f"send: {e}"
        finally:
            ev.set()
            (s.close if ok else s.cancel)()
        o.t_end = time.monotonic()
        o.problems += problems
        recorder.add(o)

    for m in models:
        ev = threading.Event()
        threading.Thread(target=run, args=(m, ev), daemon=True, name=f"soak-witness-{m}").start()
        started.append(ev)
    deadline = time.monotonic() + wait_s
    for ev in started:
        ev.wait(max(deadline - time.monotonic(), 0.0))
    return sum(ev.is_set() for ev in started)


def kill_llm_stub(ctx, server, watcher, recorder, instance: str = "llm_0_0") -> dict:
    """SIGKILL of the llm stub with one llm and one ensemble stream in flight."""
    stub = server.stub(instance)
    if stub is None:
        return {"kind": "kill_llm_stub", "ok": False, "error": f"no stub for {instance}"}
    n = witnesses(ctx, recorder, ["llm", "ensemble"])
    inc = watcher.open_incident("fault", f"SIGKILL of stub {instance} (pid {stub.pid})", "llm", injected=True)
    proctree.kill(stub, signal.SIGKILL)
    return {"kind": "kill_llm_stub", "ok": True, "t": inc.t_open, "pid": stub.pid, "witnesses_in_flight": n,
            "incident": inc}


def kill_tp_worker(ctx, server, watcher, recorder, model: str) -> dict:
    """SIGKILL of the last-rank tensor-parallel worker of the TP model, two of its streams in flight."""
    workers = server.tp_workers(f"{model}_0_0")
    if not workers:
        return {"kind": "kill_tp_worker", "ok": False, "error": f"no tensor-parallel worker of {model}_0_0"}
    victim = workers[-1]
    # the tiny TP model makes a token in milliseconds: 400 tokens keep a stream in flight for seconds
    # (and two of them fit its 64 blocks of 16 tokens)
    n = witnesses(ctx, recorder, [model, model], max_tokens={model: 400})
    inc = watcher.open_incident("fault", f"SIGKILL of {victim.name} (pid {victim.pid})", model, injected=True)
    proctree.kill(victim, signal.SIGKILL)
    return {"kind": "kill_tp_worker", "ok": True, "t": inc.t_open, "pid": victim.pid, "workers": len(workers),
            "witnesses_in_flight": n, "incident": inc}


def wait_kv(metrics_url: str, model: str, baseline: float, timeout: float) -> tuple[bool, float, dict]:
    """Poll until model's KV used blocks == baseline and nothing runs or waits; (met, seconds, last)."""
    t0 = time.monotonic()
    last: dict = {}
    while True:
        g = engine_gauges(metrics_url, [model])
        last = g.get(model, g)
        if (last.get("kv_used") == baseline and last.get("running") == 0 and last.get("waiting") == 0):
            return True, time.monotonic() - t0, last
        if time.monotonic() - t0 > timeout:
            return False, time.monotonic() - t0, last
        time.sleep(0.25)


def _flood_one(ctx, i: int, use_http: bool, barrier: threading.Barrier, out: Outcome, max_tokens: int) -> None:
    sp = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    try:
        barrier.wait(timeout=30)
    except threading.BrokenBarrierError:
        pass
    if use_http:
        out.t_send = time.monotonic()
        try:
            r = requests.post(f"{ctx.http_base()}/v2/models/llm/generate",
                              json={"text_input": "Tell me a story", "stream": False,
                                    "sampling_parameters": json.dumps(sp)}, timeout=(5, ctx.timeout_s))
            out.http_status = r.status_code
            body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"error": r.text}
            if r.status_code == 200 and "error" not in body:
                out.status, out.text = "ok", str(body.get("text_output", ""))[:200]
                out.times.append(time.monotonic())
                out.tokens.append(max_tokens)
            else:
                out.status, out.error = "error", f"HTTP {r.status_code}: {body.get('error', body)}"
        except (requests.RequestException, ValueError) as e:
            out.status, out.error = ("stall" if isinstance(e, requests.Timeout) else "error"), f"{type(e).__name__}: {e}"
        out.t_end = time.monotonic()
        return
    try:
        s = Stream(ctx.grpc_url())
    except Exception as e:  # noqa: BLE001
        out.status, out.error, out.t_end = "error", f"connect: {e}", time.monotonic()
        return
    payload = payloads.Payload("llm", "Tell me a story", sp, {"return_num_output_tokens": True},
                               payloads.Spec("llm", max_tokens, True))
    resps, problems = [], []
    ok = False
    try:
        out.t_send = s.send("llm", payload.grpc_inputs(), out.request_id)
        ok = _read(ctx, s, out, payload, resps, problems)
    except Exception as e:  # noqa: BLE001 - the stream broke before the send
        out.status, out.error = "error", f"send: {e}"
    finally:
        (s.close if ok else s.cancel)()
    out.problems += problems
    out.t_end = time.monotonic()


def flood(ctx, server, traffic, recorder, max_num_seqs: int, max_waiting: int, extra: int = 12,
          max_tokens: int = 32, kv_baseline: float = 0.0, serving=lambda: True) -> dict:
    """The flood past the waiting limit (see module doc). Traffic is paused meanwhile (bounded).
    Not injected (ok False, traffic resumed) unless the engine is idle and `serving()` after the
    pause: a flood into a dead or wedged server would measure nothing."""
    rec: dict = {"kind": "flood", "t": time.monotonic(), "ok": True}
    # requests still in flight after the stall bound are stalled: the watcher deals with those
    paused = traffic.pause(timeout=ctx.stall_s + 5)
    idle, _, gauges = wait_kv(server.metrics_url, "llm", kv_baseline, timeout=20)
    rec.update(paused=paused, idle_before=idle)
    if not (paused and idle and serving()):
        traffic.resume()
        rec.update(ok=False, error=f"server not idle and serving before the flood (clients paused {paused}, "
                                   f"llm gauges {gauges}, serving {serving()})")
        return rec
    n = max_num_seqs + max_waiting + extra
    outs = [Outcome("flood", "llm", "http" if i % 3 == 2 else "grpc", "flood", ctx.new_id(), expect="unavailable")
            for i in range(n)]
    barrier = threading.Barrier(n)
    threads = [threading.Thread(target=_flood_one, args=(ctx, i, o.protocol == "http", barrier, o, max_tokens),
                                daemon=True, name=f"soak-flood-{i}") for i, o in enumerate(outs)]
    rec["t"] = time.monotonic()
    recorder.event("fault", f"flood: {n} requests to llm at once (max_num_seqs {max_num_seqs}, "
                            f"waiting limit {max_waiting})", t=rec["t"])
    for t in threads:
        t.start()
    deadline = time.monotonic() + ctx.timeout_s + 30
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0.0))
    for o in outs:
        if not o.t_end:  # a thread still blocked: its bounded read has not returned yet
            o.status, o.error, o.t_end = "stall", "flood request still running at the flood's bound", time.monotonic()
        recorder.add(o)
    last_end = max(o.t_end for o in outs)
    refused = [o for o in outs if o.status == "error"]
    rec.update(requests=n, completed=sum(o.status == "ok" for o in outs), refused=len(refused),
               must_refuse_at_least=n - max_num_seqs - max_waiting,
               refusals_named=sum(any(w in (o.error or "") for w in LIMIT_WORDS) for o in refused),
               refusal_latency_max_s=round(max((o.t_end - o.t_send for o in refused), default=0.0), 3),
               http_refusal_statuses=sorted({o.http_status for o in refused if o.protocol == "http"}),
               other=[f"{o.protocol} {o.status}: {(o.error or '')[:200]}" for o in outs
                      if o.status not in ("ok", "error")][:10])
    back, secs, last = wait_kv(server.metrics_url, "llm", kv_baseline, timeout=KV_BACK_WITHIN_S)
    rec.update(kv_back=back, kv_back_after_s=round(secs, 2),
               kv_after=last, last_end=last_end)
    traffic.resume()
    return rec


def drain(ctx, server, recorder, max_tokens: int = 48, grace_s: float = 30.0, exit_bound_s: float = 60.0) -> dict:
    """SIGTERM with 4 streams in flight (see module doc). Leaves the server stopped."""
    rec: dict = {"kind": "drain", "ok": True}
    streams, outs, payloads_ = [], [], []
    rng = random.Random(7)
    for i, model in enumerate(("llm", "ensemble", "llm", "ensemble")):
        p = payloads.make(model, rng, max_tokens=max_tokens, long=True)
        o = Outcome("drain_stream", model, "grpc", "drain", ctx.new_id())
        try:
            s = Stream(ctx.grpc_url())
            o.t_send = s.send(model, p.grpc_inputs(), o.request_id)
        except Exception as e:  # noqa: BLE001
            o.status, o.error = "error", f"send: {e}"
            s = None
        streams.append(s)
        outs.append(o)
        payloads_.append(p)
    results: list = [None] * 4

    def read(i):
        s, o, p = streams[i], outs[i], payloads_[i]
        resps, problems = [], []
        ok = False
        if s is not None:
            try:
                ok = _read(ctx, s, o, p, resps, problems)
            finally:
                (s.close if ok else s.cancel)()
        o.t_end = time.monotonic()
        o.problems += problems
        results[i] = (ok, len(resps))

    # wait until every stream has its first response (then they are in flight for seconds)
    first_deadline = time.monotonic() + ctx.timeout_s
    while time.monotonic() < first_deadline:
        if all(s is None or not s._q.empty() for s in streams):
            break
        time.sleep(0.05)
    rec["all_in_flight"] = all(s is not None and not s._q.empty() for s in streams)
    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(4)]
    for t in readers:
        t.start()
    t_term = time.monotonic()
    recorder.event("fault", "drain: SIGTERM to the launcher with 4 streams in flight", t=t_term)
    server.terminate()
    rec["t"] = t_term
    # readiness must go false at once
    ready_false = None
    while time.monotonic() - t_term < 5:
        code = server.ready("/v2/health/ready", timeout=1)
        if code != 200:
            ready_false = time.monotonic() - t_term
            break
        time.sleep(0.1)
    rec["ready_false_after_s"] = None if ready_false is None else round(ready_false, 3)
    # a request during the drain: HTTP generate must be refused (UNAVAILABLE: 400 on Triton 2.51), fast
    t_req = time.monotonic()
    try:
        r = requests.post(f"{ctx.http_base()}/v2/models/llm/generate",
                          json={"text_input": "Hello", "stream": False, "sampling_parameters": '{"max_tokens": 4}'},
                          timeout=(3, 10))
        rec["during_drain_http"] = {"status": r.status_code, "body": r.text[:300],
                                    "seconds": round(time.monotonic() - t_req, 3)}
    except requests.RequestException as e:
        rec["during_drain_http"] = {"status": None, "body": f"{type(e).__name__}: {e}"[:300],
                                    "seconds": round(time.monotonic() - t_req, 3)}
    for t in readers:
        t.join(grace_s + ctx.stall_s)
    rec["streams"] = [{"model": o.model, "status": o.status, "error": o.error, "responses": (results[i] or (0, 0))[1],
                       "ended_after_term_s": round(o.t_end - t_term, 2) if o.t_end else None}
                      for i, o in enumerate(outs)]
    for o in outs:
        recorder.add(o)
    code = server.wait_exit(exit_bound_s)
    rec["exit_code"] = code
    rec["exit_after_s"] = round(time.monotonic() - t_term, 2) if code is not None else None
    if code is None:
        rec["killed_by_soak"] = True
    left = server.kill_all()
    rec["left_behind"] = [p.name for p in left]
    return rec
