"""RSS growth: one series per process lifetime (label + pid) from the 15 s samples taken while
traffic ran, the warm-up after the process appeared left out, and a least-squares slope in MB per
minute over the rest. Two points would measure noise (allocator arenas, caches filling); a slope
over many samples measures a trend."""

from __future__ import annotations

import numpy as np

# Measured on today's code, clean stretches (no fault) after a 5-minute warm-up of each process,
# 6 clients of the full mix: launcher, preprocessing, postprocessing ~0; tritonserver 0.15-0.21;
# ensemble stub 0.13-0.58 (allocator steps); llm stub 0.53 and 1.03 MB/min, linear (residual 0.13 MB
# over 7 minutes: a trend, not noise). The bound flags the ~1.8 MB/min the issue saw; see README "Soak".
DEFAULT_BOUND_MB_PER_MIN = 1.0
MIN_POINTS = 8                   # samples after the warm-up needed to judge a series
MIN_SPAN_S = 240.0               # and the time they must cover (shorter fits follow allocator steps)


def series(samples: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """{process key: [(t, rss_mb)]} over the samples taken while traffic ran."""
    out: dict[str, list] = {}
    for s in samples:
        if not s.get("traffic"):
            continue
        for key, v in s.get("rss", {}).items():
            out.setdefault(key, []).append((s["t"], v["rss_mb"]))
    return out


def fit(points: list[tuple[float, float]], first_seen: float, warmup_s: float,
        exclude: list[tuple[float, float]] = ()) -> dict:
    """Slope (MB/min) of the points after first_seen + warmup_s and outside the `exclude` windows."""
    pts = [(t, v) for t, v in points if t >= first_seen + warmup_s and not any(a <= t <= b for a, b in exclude)]
    res = {"points": len(pts), "span_s": 0.0, "slope_mb_per_min": None, "start_mb": None, "end_mb": None}
    if len(pts) < 2:
        return res
    t = np.array([p[0] for p in pts]) / 60.0
    y = np.array([p[1] for p in pts])
    slope, icpt = np.polyfit(t, y, 1)
    res.update(span_s=round(float(t[-1] - t[0]) * 60, 1), slope_mb_per_min=round(float(slope), 3),
               start_mb=round(float(y[0]), 1), end_mb=round(float(y[-1]), 1),
               residual_mb=round(float(np.std(y - (slope * t + icpt))), 2))
    return res


def fits(samples: list[dict], first_seen: dict[str, float], warmup_s: float,
         exclude: list[tuple[float, float]] = ()) -> dict[str, dict]:
    """fit() for every process series; first_seen: process key -> first sample time (any sample)."""
    out = {}
    for key, pts in series(samples).items():
        name = key.split("#")[0]
        r = fit(pts, first_seen.get(key, pts[0][0]), warmup_s, exclude)
        r["name"] = name
        r["judged"] = bool(r["points"] >= MIN_POINTS and r["span_s"] >= MIN_SPAN_S)
        out[key] = r
    return out


def first_seen(samples: list[dict]) -> dict[str, float]:
    """Process key -> time of its first sample (monotonic seconds)."""
    seen: dict[str, float] = {}
    for s in samples:
        for key in s.get("rss", {}):
            seen.setdefault(key, s["t"])
    return seen
