"""Scrape Triton's Prometheus endpoint and print the LLM metric families as a readable table.

    .venv/bin/python client_examples/metrics_scrape.py [--url 127.0.0.1:8002] [--prefix llm_] [--watch 5]

Counters and gauges print their value; histograms print count, mean (sum / count) and p50 / p90 / p99
estimated from the cumulative buckets the way Prometheus' histogram_quantile() does: find the bucket
holding the rank, interpolate linearly between its lower and upper bound (the first bucket starts at
0). A quantile that lands in the +Inf bucket is printed as ">" the largest finite bound. Every series
is one row; its `model` / `version` / `instance` labels are shown as model/version/instance, any other
label (finish_reason) as key=value. Only the standard library is needed.
"""

import argparse
import math
import re
import sys
import time
import urllib.request
from collections import OrderedDict

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_SOURCE_LABELS = ("model", "version", "instance")


def fetch(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8")


def parse(text: str, prefix: str):
    """{family: {"type", "help", "series": {labels tuple: {...}}}} for families whose name starts
    with prefix. Counter / gauge series hold {"value"}; histogram series {"buckets": [(le, cum)],
    "sum", "count"}."""
    families: "OrderedDict[str, dict]" = OrderedDict()
    types, helps = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            parts = line.split(None, 3)
            if len(parts) >= 3:
                (types if parts[1] == "TYPE" else helps)[parts[2]] = parts[3] if len(parts) > 3 else ""
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or not m.group(1).startswith(prefix):
            continue
        name, labels, value = m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))
        family, kind = name, None
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and types.get(base) == "histogram":
                family, kind = base, suffix[1:]
                break
        fam = families.setdefault(family, {"type": types.get(family, "untyped"), "help": helps.get(family, ""),
                                           "series": OrderedDict()})
        le = labels.pop("le", None)
        key = tuple(sorted(labels.items()))
        series = fam["series"].setdefault(key, {"buckets": [], "sum": 0.0, "count": 0.0, "value": None})
        if kind == "bucket":
            series["buckets"].append((math.inf if le in ("+Inf", "Inf") else float(le), value))
        elif kind in ("sum", "count"):
            series[kind] = value
        else:
            series["value"] = value
    return families


def quantile(q: float, buckets: list) -> tuple[float, bool]:
    """(estimate, exact_bound_exceeded) for cumulative buckets [(upper bound, cumulative count)]."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return math.nan, False
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, cum in buckets:
        if cum >= rank:
            if math.isinf(upper):
                return lower, True  # in the +Inf bucket: only "above the last finite bound" is known
            if cum == below:
                return upper, False
            return lower + (upper - lower) * (rank - below) / (cum - below), False
        lower, below = upper, cum
    return lower, True


def fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    if abs(v) >= 100:
        return f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.3f}"
    return f"{v:.4g}"


def row_label(labels: tuple) -> str:
    d = dict(labels)
    source = "/".join(d.pop(k) for k in _SOURCE_LABELS if k in d)
    extra = " ".join(f"{k}={v}" for k, v in d.items())
    return " ".join(x for x in (source, extra) if x)


def render(families) -> str:
    scalar_rows, hist_rows = [], []
    for name, fam in families.items():
        for labels, s in fam["series"].items():
            if fam["type"] == "histogram":
                cnt = s["count"] or (sorted(s["buckets"])[-1][1] if s["buckets"] else 0.0)
                qs = []
                for q in (0.5, 0.9, 0.99):
                    v, above = quantile(q, s["buckets"])
                    qs.append((">" if above else "") + fmt(v))
                mean = s["sum"] / cnt if cnt else math.nan
                hist_rows.append([name, row_label(labels), fmt(cnt), fmt(mean), *qs])
            else:
                scalar_rows.append([name, fam["type"], row_label(labels), fmt(s["value"])])
    out = []
    if scalar_rows:
        out.append(table(["metric", "type", "series", "value"], scalar_rows, right=(3,)))
    if hist_rows:
        out.append(table(["histogram", "series", "count", "mean", "p50", "p90", "p99"], hist_rows,
                         right=(2, 3, 4, 5, 6)))
    return "\n\n".join(out) if out else "(no matching metric families)"


def table(header, rows, right=()) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for r in [header, ["-" * w for w in widths]] + rows:
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="127.0.0.1:8002", help="metrics endpoint host:port (or a full URL)")
    ap.add_argument("--prefix", default="llm_", help="metric family name prefix to show ('' = all)")
    ap.add_argument("--watch", type=float, default=0.0, help="repeat every N seconds until Ctrl-C (0: once)")
    args = ap.parse_args()
    url = args.url if args.url.startswith("http") else f"http://{args.url}/metrics"
    while True:
        try:
            text = fetch(url)
        except OSError as e:
            print(f"error: cannot scrape {url}: {e}", file=sys.stderr)
            return 1
        print(f"# {url} at {time.strftime('%H:%M:%S')}")
        print(render(parse(text, args.prefix)))
        if args.watch <= 0:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
        print()


if __name__ == "__main__":
    sys.exit(main())
