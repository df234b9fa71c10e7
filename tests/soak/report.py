"""The soak's outputs in build/soak/ (or --out): report.json (configuration, the 15 s timeline,
faults, incidents, checks, the closing summary) and soak.png (RSS, KV, throughput and errors over
time, fault times marked), plus the closing summary printed as text."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from checks import classify


def _pct(values, ps=(50, 90, 99)) -> dict:
    if not values:
        return {f"p{p}": None for p in ps} | {"n": 0}
    a = np.asarray(values, dtype=float)
    return {f"p{p}": round(float(np.percentile(a, p)) * 1000, 1) for p in ps} | {"n": int(a.size)}


def intervals(samples: list[dict], outcomes, wins, t0: float) -> list[dict]:
    """One row per 15 s sample: its gauges, RSS and readiness, and the requests of the interval
    that ends at it (latency percentiles in ms, throughput, errors by kind)."""
    rows, prev = [], t0
    for s in samples:
        a, b = prev, s["t"]
        done = [o for o in outcomes if a < (o.t_end or 0) <= b]
        tok = sum(n for o in outcomes for t, n in zip(o.times, o.tokens) if a < t <= b)
        errors: dict = {}
        for o in done:
            kind, expected = classify(o, wins)
            if kind not in ("ok", "cancelled"):
                key = kind if not expected else f"{kind} (expected)"
                errors[key] = errors.get(key, 0) + 1
        ok = [o for o in done if o.status == "ok" and not o.problems]
        span = max(b - a, 1e-9)
        rows.append({
            "t": round(b - t0, 1), "traffic": s.get("traffic"), "engines": s["engines"], "ready": s["ready"],
            "rss_mb": {k: v["rss_mb"] for k, v in s["rss"].items()},
            "ttft_ms": _pct([o.ttft for o in ok if o.ttft is not None]),
            "itl_ms": _pct([x for o in ok for x in o.itl()]),
            "e2e_ms": _pct([o.t_end - o.t_send for o in ok]),
            "tokens_per_s": round(tok / span, 2), "completed_per_s": round(len(ok) / span, 3),
            "requests_ended": len(done), "errors": errors})
        prev = b
    return rows


def _jsonable(x):
    if dataclasses.is_dataclass(x):
        return _jsonable(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    return x


def summary(run: dict, rows: list[dict]) -> dict:
    """The closing note: minutes run, requests, errors by kind, crashes, recoveries and their
    times, KV and RSS at start and end."""
    rel = run["rel"]
    outs = run["outcomes"]
    by_kind: dict = {}
    for o in outs:
        kind, expected = classify(o, run["windows"])
        by_kind.setdefault(kind + ("" if expected else " (unexpected)"), 0)
        by_kind[kind + ("" if expected else " (unexpected)")] += 1
    traffic_rows = [r for r in rows if r["traffic"]]
    first, last = (traffic_rows[0], traffic_rows[-1]) if traffic_rows else ({}, {})

    def rss_by_name(row):
        out: dict = {}
        for k, v in row.get("rss_mb", {}).items():
            out[k.split("#")[0]] = v
        return out

    return {
        "soak_minutes": round(run["traffic_s"] / 60, 2),
        "requests": len(outs),
        "requests_by_status": {s: sum(o.status == s for o in outs) for s in sorted({o.status for o in outs})},
        "lora_requests_by_status": {f"{a}:{s}": sum(o.lora == a and o.status == s for o in outs)
                                    for a, s in sorted({(o.lora, o.status) for o in outs if o.lora})},
        "outcomes_by_kind": dict(sorted(by_kind.items())),
        "crashes": [f"+{rel(i.t_open):.0f}s {i.kind}: {i.what}" for i in run["incidents"] if not i.injected],
        "recoveries": [{"what": i.what, "at_s": rel(i.t_open),
                        "recovered_after_s": None if i.recovered_at is None else round(i.recovered_at - i.t_open, 1),
                        "how": i.closed_how or "open"} for i in run["incidents"]],
        "restarts_by_soak": [{"at_s": rel(r["t"]), "why": r["why"], "ready_after_s": r["ready_after_s"]}
                             for r in run["restarts"]],
        "kv_idle_before_traffic": run.get("kv_start"),
        "kv_idle_after_traffic": {m: v[2] for m, v in run["idle_end"].items()},
        "rss_start_mb": rss_by_name(first), "rss_end_mb": rss_by_name(last),
        "failed_checks": [c.name for c in run["checks"] if not c.ok],
    }


def write(run: dict, out_dir: Path) -> dict:
    """Write report.json and soak.png; returns the report dict."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = run["t0"]
    rows = intervals(run["samples"], run["outcomes"], run["windows"], t0)
    rel = run["rel"]
    faults = []
    for f in run["faults"]:
        f = {k: v for k, v in f.items() if k != "incident"}
        for k in ("t", "last_end"):
            if k in f and isinstance(f[k], float):
                f[k] = rel(f[k])
        faults.append(f)
    incidents = []
    for i in run["incidents"]:
        d = dataclasses.asdict(i)
        for k in ("t_open", "ready_false_at", "recovered_at", "serving_from", "closed_at", "server_exited_at"):
            d[k] = rel(d[k])
        d["ready_200_while_down"] = [rel(t) for t in d["ready_200_while_down"]][:20]
        incidents.append(d)
    drain = dict(run["drain"]) if run.get("drain") else None
    if drain and "t" in drain:
        drain["t"] = rel(drain["t"])
    report = {
        "config": run["config"],
        "passed": all(c.ok for c in run["checks"]),
        "checks": [dataclasses.asdict(c) for c in run["checks"]],
        "summary": summary(run, rows),
        "rss_bound_mb_per_min": run["rss_bound"],
        "rss_step_bound_mb": run.get("rss_step_bound"),
        "rss_fits": run["rss"],
        "rss_kinds": run["rss_kinds"],
        "timeline": rows,
        "events": [{"t": rel(e.t), "kind": e.kind, "what": e.what} for e in run["events"]],
        "faults": faults,
        "incidents": incidents,
        "drain": drain,
        "idle_end": {m: {"met": a, "seconds": round(b, 2), "last": c} for m, (a, b, c) in run["idle_end"].items()},
        "server_starts": run["server_starts"],
        "log_errors": run.get("log_errors", []),
    }
    # default=str: a value of an unforeseen type must not cost the whole report
    (out_dir / "report.json").write_text(json.dumps(_jsonable(report), indent=1, default=str))
    with open(out_dir / "outcomes.jsonl", "w") as f:  # every request, for digging into a failure
        for o in run["outcomes"]:
            kind, expected = classify(o, run["windows"])
            f.write(json.dumps({"id": o.request_id, "scenario": o.scenario, "model": o.model, "protocol": o.protocol,
                                "client": o.client, "status": o.status, "kind": kind, "expected": expected,
                                "t_send": rel(o.t_send), "t_end": rel(o.t_end), "tokens": sum(o.tokens),
                                "ttft_s": None if o.ttft is None else round(o.ttft, 3), "http_status": o.http_status,
                                "error": (o.error or "")[:300] or None, "problems": o.problems[:3],
                                "lora": o.lora}) + "\n")
    try:
        plot(rows, report["events"], out_dir / "soak.png")
    except Exception as e:  # noqa: BLE001 - the JSON report is what matters
        print(f"soak: plot failed: {type(e).__name__}: {e}")
    return report


def plot(rows: list[dict], events: list[dict], path: Path) -> None:
    """soak.png: RSS growth per process, KV blocks, throughput and errors per interval, events marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["t"] / 60 for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(12, 13), sharex=True)
    ax = axes[0]
    keys = sorted({k for r in rows for k in r["rss_mb"]})
    names = sorted({k.split("#")[0] for k in keys})
    colour = {n: plt.cm.tab20(i % 20) for i, n in enumerate(names)}
    labelled = set()
    for k in keys:  # one colour per process name, one line per process lifetime (pid)
        name = k.split("#")[0]
        mine = [r for r in rows if k in r["rss_mb"] and r["traffic"]] or [r for r in rows if k in r["rss_mb"]]
        xs = [r["t"] / 60 for r in mine]
        ys = [r["rss_mb"][k] for r in mine]
        # growth since the process's first sample under traffic (a stub still loading its model
        # would dwarf the rest; sizes span 20 MB..2 GB): a leak is a slope
        y0 = ys[0]
        ax.plot(xs, [y - y0 for y in ys], marker=".", lw=1, color=colour[name],
                label=None if name in labelled else f"{name} ({y0:.0f} MB)")
        labelled.add(name)
    ax.set_ylabel("RSS growth (MB)")
    ax.legend(fontsize=6, ncol=3, loc="upper left")
    ax = axes[1]
    models = sorted({m for r in rows for m in r["engines"] if m != "error"})
    for m in models:
        for key, style in (("kv_used", "-"), ("kv_free", ":")):
            ys = [(r["engines"].get(m) or {}).get(key) for r in rows]
            ax.plot(x, [np.nan if y is None else y for y in ys], style, marker=".", label=f"{m} {key}")
    ax.set_ylabel("KV blocks")
    ax.set_yscale("symlog")
    ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    ax.plot(x, [r["tokens_per_s"] for r in rows], marker=".", label="output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(x, [r["completed_per_s"] for r in rows], color="tab:green", marker=".", label="requests completed/s")
    ax.set_ylabel("tokens/s")
    ax2.set_ylabel("requests/s")
    ax.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="upper right", fontsize=7)
    ax = axes[3]
    kinds = sorted({k for r in rows for k in r["errors"]})
    bottom = np.zeros(len(rows))
    width = (x[1] - x[0]) * 0.8 if len(x) > 1 else 0.2
    for k in kinds:
        ys = np.array([r["errors"].get(k, 0) for r in rows], dtype=float)
        ax.bar(x, ys, width=width, bottom=bottom, label=k, alpha=0.5 if "(expected)" in k else 1.0)
        bottom += ys
    ax.set_ylabel("errors per interval")
    ax.set_xlabel("minutes since the soak started")
    if kinds:
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    colours = {"fault": "tab:red", "crash": "black", "wedge": "black", "unhealthy": "black", "restart": "tab:purple"}
    for ev in events:
        if ev["kind"] in colours:
            for a in axes:
                a.axvline(ev["t"] / 60, color=colours[ev["kind"]], ls="--", lw=0.8, alpha=0.7)
            axes[0].annotate(re.sub(r"\s*\(.*", "", ev["what"])[:28], (ev["t"] / 60, 1), xycoords=("data", "axes fraction"),
                             rotation=90, fontsize=6, va="top", ha="right", color=colours[ev["kind"]])
    fig.suptitle("soak: RSS growth since each process's first sample under traffic, KV blocks, throughput, errors\n"
                 "(dashed lines: faults red, crashes / wedges black, restarts by the soak purple)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_summary(report: dict) -> None:
    """Print the closing note and every check (PASS / FAIL with its failures)."""
    s = report["summary"]
    print("\n==== soak summary ====")
    print(f"minutes of traffic {s['soak_minutes']}, requests {s['requests']}: {s['requests_by_status']}")
    print(f"of which named a LoRA adapter: {s['lora_requests_by_status']}")
    print("outcomes by kind: " + ", ".join(f"{k} {v}" for k, v in s["outcomes_by_kind"].items()))
    print(f"crashes (no fault injected): {len(s['crashes'])}" + "".join(f"\n  {c}" for c in s["crashes"]))
    for r in s["recoveries"]:
        print(f"  incident at +{r['at_s']:.0f}s {r['what']}: "
              + (f"serving again after {r['recovered_after_s']} s" if r["recovered_after_s"] is not None else r["how"]))
    for r in s["restarts_by_soak"]:
        print(f"  restart by the soak at +{r['at_s']:.0f}s ({r['why']}), ready after {r['ready_after_s']} s")
    print(f"KV idle before traffic {s['kv_idle_before_traffic']}\nKV idle after traffic  {s['kv_idle_after_traffic']}")
    print("RSS MB start -> end: " + ", ".join(f"{k} {s['rss_start_mb'].get(k)} -> {v}" for k, v in s["rss_end_mb"].items()))
    print("\nchecks:")
    for c in report["checks"]:
        print(f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}")
        for f in c["failures"][:6]:
            print(f"         - {f}")
    print("\nRESULT: " + ("PASS" if report["passed"] else "FAIL: " + "; ".join(s["failed_checks"])))
