"""Drain on shutdown (SIGTERM / Ctrl-C of `make serve`): stop taking requests, let those in flight
finish, then let tritonserver exit by itself with code 0.

0. only with an accept window (DRAIN_ACCEPT_S > 0, default 0): the readiness gate closes first and new
   requests are still served for that many seconds, so that a load balancer that learns of the drain
   only from its health checks (HAProxy: deploy/haproxy/haproxy.cfg) and routes here until enough of
   them failed does not hand its clients a refusal; then steps 1-4, step 2 already done. It is the
   `preStop` sleep of Kubernetes (where endpoints follow the pod's termination, not its probes) with
   readiness false during it, which is what a balancer that only sees health checks needs;
1. every stub of ours gets {"type": "drain", "grace_s": N} on its control socket
   (paddle_llm_triton/engine_channel/control_bus.py): new requests are refused at once with
   UNAVAILABLE, the ones in flight go on;
2. the readiness gate (gate.py) closes: /v2/health/ready answers 400 from now on, so load balancers
   and Kubernetes stop routing here;
3. the stubs are polled ({"type": "status"}) until none has a request in flight, or until the grace
   period (plus 5 s for the stubs' own deadline handling) is over; at the deadline the llm instances
   end their remaining requests with an error saying the server shut down;
4. every model is unloaded (idle now: each unload completes at once), tritonserver gets SIGTERM and
   then the gate's pending load is let end (handle.stop()): with nothing loaded and no stream open it exits 0 within
   about 4 s (measured on 2 idle cores). When Triton keeps a model although every request finished, it exits 1
   after its exit timeout; the launcher still reports a clean drain (`clean_despite_exit_code`).
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

from paddle_llm_triton.engine_channel import control_bus
from paddle_llm_launcher.gate import GATE_MODELS
from paddle_llm_launcher.repository import RepositoryError

ACCEPT_ENV = "DRAIN_ACCEPT_S"


def accept_seconds(env=None) -> float:
    """The drain's accept window in seconds from DRAIN_ACCEPT_S (unset or empty: 0, refuse at once).
    Read when the server starts, so that a bad value fails then and not at the SIGTERM: ValueError
    naming the variable unless it is a finite number >= 0."""
    raw = (os.environ if env is None else env).get(ACCEPT_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{ACCEPT_ENV} must be a finite number of seconds >= 0, got {raw!r}")
    return value


def drain(server, grace_s: float, log: Callable[[str], None] = print, accept_s: float = 0.0) -> dict:
    """Steps 0-4 up to the SIGTERM (see the module doc). accept_s: the accept window (seconds, 0: none,
    refusals start at once as before). The grace period for the requests in flight starts when the
    refusals do, so the whole drain takes up to accept_s + grace_s + 5 s plus the unload. Returns a
    summary: in_flight when refusals started, left (requests still in flight when waiting ended),
    open_responses, stuck (models Triton kept), accept_s, seconds (the whole drain)."""
    t0 = time.monotonic()
    repo = server.repository()
    if accept_s > 0:
        server.gate.close()
        log(f"launch_triton: readiness false; new requests still served for {accept_s:g} s ({ACCEPT_ENV}) "
            f"while load balancers notice, then refused")
        time.sleep(accept_s)
    targets = control_bus.bound_instances(server.pid)
    first = control_bus.ask(server.pid, targets, {"type": "drain", "grace_s": grace_s}, timeout=2.0)
    start_in_flight = sum(int(r.get("in_flight", 0)) for r in first.values())
    if accept_s <= 0:
        # refusals first, then readiness: nothing is admitted once readiness is false (issue 14 contract)
        server.gate.close()
    log(f"launch_triton: draining: {start_in_flight} request(s) in flight on {len(targets)} stub(s), "
        f"new requests refused with UNAVAILABLE, readiness false, grace period {grace_s:.0f} s")
    left, replies = start_in_flight, first
    while time.monotonic() - t0 < grace_s + 5.0:
        replies = control_bus.ask(server.pid, targets, {"type": "status"}, timeout=1.0)
        left = sum(int(r.get("in_flight", 0)) for r in replies.values())
        if left == 0 and len(replies) == len(targets):
            break
        time.sleep(0.2)
    open_responses = {f"{m}/{i}": r.get("open_responses") for (m, i), r in replies.items() if r.get("open_responses")}
    if open_responses:
        log(f"launch_triton: responses never finished at the end of the drain: {open_responses}")
    stuck: list[str] = []
    try:
        models = [m for m, state in repo.index().items() if state == "READY" and m not in GATE_MODELS]
        for m in models:
            repo.unload(m)
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline and any(s in ("READY", "UNLOADING") for s in repo.index().values()):
            time.sleep(0.1)
        stuck = [m for m, s in repo.index().items() if s in ("READY", "UNLOADING")]
        if stuck:
            log(f"launch_triton: still unloading after 15 s: {', '.join(stuck)} (Triton holds a request of theirs)")
    except (RepositoryError, OSError) as e:
        log(f"launch_triton: unloading the models failed ({e})")
    took = time.monotonic() - t0
    log(f"launch_triton: drained in {took:.1f} s ({left} request(s) were still in flight at the end)")
    return {"in_flight": start_in_flight, "left": left, "open_responses": open_responses, "stuck": stuck,
            "accept_s": accept_s, "seconds": took}


def clean_despite_exit_code(summary: dict | None, code: int, killed: bool) -> bool:
    """True when tritonserver's non-zero exit after a drain lost nothing: every request finished
    (none left, no response sender without its FINAL) and the only trouble was a model Triton did
    not finish unloading (Triton 2.51 then exits 1 after --exit-timeout-secs: "Exit timeout
    expired" with "0 in-flight inferences"; what keeps such a model is inside Triton, seen after
    long soaks with many cancelled and disconnected clients). That includes a tritonserver the
    launcher had to kill: a client that keeps its gRPC stream open after its last answer holds the
    model and then Triton's exit past its timeout (a new user's check), and nothing of it is lost."""
    return (summary is not None and code != 0 and summary.get("left") == 0
            and not summary.get("open_responses") and bool(summary.get("stuck")))
