#!/usr/bin/env python3
"""Draw the main panels of deploy/grafana/paddle-llm-dashboard.json from Prometheus query results.

The input is what tests/e2e/test_e2e_dashboard.py stores after it checked every query of the dashboard
against a real Prometheus scraping a real server under load: build/dashboard/query_results.json (each
panel's queries, with the template variables substituted, and their /api/v1/query_range results).
To regenerate the picture of docs/operations/dashboard.md:

    .venv/bin/python -m pytest -q tests/e2e/test_e2e_dashboard.py
    .venv/bin/python deploy/grafana/render_panels.py            # -> docs/images/dashboard.png

Grafana is not needed: matplotlib draws the same series with the panels' titles, units and legends.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_IN = REPO / "build" / "dashboard" / "query_results.json"
DEFAULT_OUT = REPO / "docs" / "images" / "dashboard.png"
# panels drawn, in order; a tuple shares one plot
MAIN = ["Token throughput", "Finished requests", "Requests running / waiting",
        "Time to first token", "Inter-token latency", "End-to-end request latency",
        "KV cache usage", "Prefix cache hit rate", "Request queue time",
        "Preemptions", "Rejected requests", ("Engine healthy", "Engine restarts")]
UNITS = {"tokens/s": "tokens / s", "reqps": "requests / s", "s": "seconds", "percentunit": "%", "short": ""}


def legend(fmt: str, labels: dict) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt or "")
    return " ".join(text.split()) or json.dumps(labels)


def draw(ax, panels: list[dict], t0: float, short_names: dict[str, str]) -> None:
    unit = panels[0]["unit"]
    for p in panels:
        for t in p["targets"]:
            for s in t["result"]:
                xs = [float(ts) - t0 for ts, _ in s["values"]]
                ys = [float(v) for _, v in s["values"]]
                if unit == "percentunit":
                    ys = [100 * y for y in ys]
                name = legend(t["legend"], s["metric"])
                for long, short in short_names.items():
                    name = name.replace(long, short)
                if len(panels) > 1:
                    name = f"{p['title'].replace('Engine ', '')}: {name}"
                ys = [y if math.isfinite(y) else float("nan") for y in ys]
                ax.plot(xs, ys, marker=".", markersize=3, linewidth=1.2, label=name)
    ax.set_title(" / ".join(p["title"] for p in panels), fontsize=10)
    ax.set_ylabel(UNITS.get(unit, unit), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="best")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="?", type=Path, default=DEFAULT_IN)
    ap.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(args.results.read_text())
    by_title = {p["title"]: p for p in data["panels"]}
    # one server in the picture: show its engine (llm_0_0) and call the server "server"
    servers = sorted({s["metric"].get("instance", "") for p in data["panels"] for t in p["targets"]
                      for s in t["result"]} - {""})
    short = {srv: ("server" if len(servers) == 1 else f"server {i}") for i, srv in enumerate(servers)}
    rows = math.ceil(len(MAIN) / 3)
    fig, axes = plt.subplots(rows, 3, figsize=(15, 3.1 * rows), constrained_layout=True)
    for ax, entry in zip(axes.flat, MAIN):
        titles = entry if isinstance(entry, tuple) else (entry,)
        missing = [t for t in titles if t not in by_title]
        if missing:
            raise SystemExit(f"panel(s) {missing} not in {args.results}")
        # x = 0 when the load started (the query window opens two scrapes earlier)
        t0 = data.get("load_started", data["start"] + 2 * data["scrape_interval_s"])
        draw(ax, [by_title[t] for t in titles], t0, short)
    for ax in axes.flat[len(MAIN):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds since the load started", fontsize=8)
    load = data["load"]
    fig.suptitle(f"{data['dashboard']}: Prometheus (scrape {data['scrape_interval_s']} s, rate over "
                 f"{data['rate_interval']}) on one server under {load['clients']} streaming clients for "
                 f"{load['seconds']:g} s ({load['requests']} requests)", fontsize=11)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=80)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
