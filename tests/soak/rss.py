"""RSS growth: one series per process lifetime (label + pid) from the 15 s samples taken while
traffic ran, the warm-up after the process appeared left out, and the windows after each fault left
out. The points left form segments (the stretches between faults). Growth is judged two ways:

- trend: one slope shared by all segments with an intercept of its own per segment (least squares
  with a per-segment offset, i.e. the pooled within-segment slope), in MB per minute. A leak per
  request shows in every segment; a level shift inside a fault window (the allocator's high-water
  mark after a flood's batch) does not tilt it, as it did a single straight line.
- steps: the sum of the upward level shifts between consecutive segments (the difference of their
  intercepts), in MB. A one-off shift after the first flood passes; memory kept on every fault
  (a leak per restart or per flood) adds up and fails.

The trend is judged per process kind (the label: all lifetimes of the llm stub, say), pooling
every lifetime's stretches with an intercept each: a leak per request grows every lifetime of that
kind alike, while the growth a fresh process shows in its first minutes (allocator arenas and caches
filling to the working set of the mix) is one lifetime's and is outweighed by the others. A lifetime
is judged on its own as well once its stretches cover LIFETIME_SPAN_S: long enough that a few MB of
such early growth cannot read as a slope over the bound.

Two points would measure noise (allocator arenas, caches filling); a slope over many samples
measures a trend."""

from __future__ import annotations

import numpy as np

# Measured on today's code, clean stretches (no fault) after a 5-minute warm-up of each process,
# 6 clients of the full mix: launcher, preprocessing, postprocessing ~0; tritonserver 0.15-0.21;
# ensemble stub 0.13-0.58 (allocator steps); llm stub 0.01-0.27 MB/min since every numpy -> tensor
# conversion stopped leaking (0.53-1.38 before). The bound flags the ~1.8 MB/min the issue saw and
# anything near it; see docs/testing/soak.md.
DEFAULT_BOUND_MB_PER_MIN = 1.0
# Upward level shifts across fault windows, summed per process lifetime. Measured: one 6.3 MB step
# of the llm stub after the first flood of a 2-hour run (flat before and after), the ensemble stub's
# 1-4 MB steps getting smaller. A process that kept 2 MB on each of the 16 faults of a 2-hour run
# would sum to 32 MB.
DEFAULT_STEP_BOUND_MB = 16.0
MIN_POINTS = 8                   # samples after the warm-up needed to judge a series
MIN_SPAN_S = 240.0               # and the time its segments must cover together
MIN_SEGMENT_POINTS = 3           # a shorter segment gives neither a slope nor a reliable level
# A lifetime's own trend is judged from this span of stretches on. Measured (2-hour run of commit
# 67d51d3, every stub kill restarting the server, so llm stubs lived ~15 min): two llm stubs grew at
# 1.10 and 1.13 MB/min over their single 4-8-minute stretch right after the warm-up, ~6 MB that then
# stopped, while the other lifetimes of the same kind were 0.00-0.61 MB/min. 20 minutes at the
# 1.0 MB/min bound is 20 MB, beyond such an early step (and beyond the 16 MB step bound).
LIFETIME_SPAN_S = 1200.0


def series(samples: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """{process key: [(t, rss_mb)]} over the samples taken while traffic ran."""
    out: dict[str, list] = {}
    for s in samples:
        if not s.get("traffic"):
            continue
        for key, v in s.get("rss", {}).items():
            out.setdefault(key, []).append((s["t"], v["rss_mb"]))
    return out


def segments(points: list[tuple[float, float]], first_seen: float, warmup_s: float,
             exclude: list[tuple[float, float]] = ()) -> list[list[tuple[float, float]]]:
    """The points after first_seen + warmup_s and outside the `exclude` windows, split wherever an
    exclude window (or a gap in sampling) lies between two consecutive points. Segments shorter than
    MIN_SEGMENT_POINTS are dropped."""
    segs: list[list] = []
    cur: list = []
    prev_t = None
    for t, v in sorted(points):
        if t < first_seen + warmup_s:
            continue
        if any(a <= t <= b for a, b in exclude):
            if cur:
                segs.append(cur)
                cur = []
            prev_t = None
            continue
        if prev_t is not None and any(prev_t < a < t or prev_t < b < t for a, b in exclude):
            segs.append(cur)
            cur = []
        cur.append((t, v))
        prev_t = t
    if cur:
        segs.append(cur)
    return [s for s in segs if len(s) >= MIN_SEGMENT_POINTS]


def fit_segments(segs: list[list[tuple[float, float]]]) -> dict:
    """The pooled fit of stretches: y = slope * t + c_segment, least squares (t in minutes).

    segs: [[(t seconds, rss MB)]] stretches, each of at least MIN_SEGMENT_POINTS points, in time
    order within each. Returns points, segments, span_s (summed over segments), slope_mb_per_min,
    steps_mb (upward shifts between consecutive intercepts, summed, and at most the rise from the
    first stretch's mean level to the last one's: memory kept across faults must still be there at
    the end; a one-off release inside a stretch otherwise tilts the pooled slope down and shows as
    upward intercept shifts, measured: the OpenAI frontend dropped 179 -> 145 MB once and was judged
    to have kept 30 MB; meaningful for the stretches of one lifetime in time order), line_slope_mb_per_min (one straight line over all the points, for
    comparison), start_mb / end_mb and residual_mb (std of the fit's residuals). None where fewer
    than 2 points remain."""
    pts = [p for sg in segs for p in sg]
    res = {"points": len(pts), "segments": len(segs), "span_s": 0.0, "slope_mb_per_min": None,
           "steps_mb": 0.0, "line_slope_mb_per_min": None, "start_mb": None, "end_mb": None}
    if len(pts) < 2:
        return res
    t = np.array([p[0] for p in pts]) / 60.0
    y = np.array([p[1] for p in pts])
    # Design matrix: t, then one indicator column per segment (their coefficients are the offsets).
    seg_of = np.concatenate([np.full(len(sg), i) for i, sg in enumerate(segs)])
    X = np.column_stack([t] + [(seg_of == i).astype(float) for i in range(len(segs))])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    slope, offsets = float(coef[0]), coef[1:]
    line = np.polyfit(t, y, 1)[0]
    res.update(span_s=round(sum(sg[-1][0] - sg[0][0] for sg in segs), 1),
               slope_mb_per_min=round(slope, 3),
               steps_mb=round(min(float(np.sum(np.clip(np.diff(offsets), 0.0, None))),
                                  max(0.0, float(np.mean([p[1] for p in segs[-1]]) - np.mean([p[1] for p in segs[0]])))),
                              2),
               line_slope_mb_per_min=round(float(line), 3),
               start_mb=round(float(y[0]), 1), end_mb=round(float(y[-1]), 1),
               residual_mb=round(float(np.std(y - X @ coef)), 2))
    return res


def fit(points: list[tuple[float, float]], first_seen: float, warmup_s: float,
        exclude: list[tuple[float, float]] = ()) -> dict:
    """Trend and steps of one process lifetime: fit_segments() of its segments().

    points: [(t seconds, rss MB)]; exclude: [(t0, t1)] seconds windows left out (after faults)."""
    return fit_segments(segments(points, first_seen, warmup_s, exclude))


def fits(samples: list[dict], first_seen: dict[str, float], warmup_s: float,
         exclude: list[tuple[float, float]] = ()) -> dict[str, dict]:
    """fit() for every process lifetime; first_seen: process key -> first sample time (any sample).
    A lifetime's trend is judged (`judged`) when its segments hold MIN_POINTS points over
    LIFETIME_SPAN_S seconds; its steps (`steps_judged`) from MIN_SPAN_S seconds on."""
    out = {}
    for key, pts in series(samples).items():
        name = key.split("#")[0]
        r = fit(pts, first_seen.get(key, pts[0][0]), warmup_s, exclude)
        r["name"] = name
        enough = r["points"] >= MIN_POINTS
        r["judged"] = bool(enough and r["span_s"] >= LIFETIME_SPAN_S)
        r["steps_judged"] = bool(enough and r["span_s"] >= MIN_SPAN_S)
        out[key] = r
    return out


def fits_by_kind(samples: list[dict], first_seen: dict[str, float], warmup_s: float,
                 exclude: list[tuple[float, float]] = ()) -> dict[str, dict]:
    """The pooled trend per process kind (label): fit_segments() of the segments of all its
    lifetimes, each with an intercept of its own; `lifetimes` counts them. Judged when the segments
    hold MIN_POINTS points over MIN_SPAN_S seconds."""
    segs: dict[str, list] = {}
    lives: dict[str, int] = {}
    for key, pts in series(samples).items():
        name = key.split("#")[0]
        mine = segments(pts, first_seen.get(key, pts[0][0]), warmup_s, exclude)
        segs.setdefault(name, []).extend(mine)
        lives[name] = lives.get(name, 0) + (1 if mine else 0)
    out = {}
    for name, sg in segs.items():
        r = fit_segments(sg)
        r["steps_mb"] = None  # intercepts of different lifetimes are not a sequence
        r["name"], r["lifetimes"] = name, lives[name]
        r["judged"] = bool(r["points"] >= MIN_POINTS and r["span_s"] >= MIN_SPAN_S)
        out[name] = r
    return out


def first_seen(samples: list[dict]) -> dict[str, float]:
    """Process key -> time of its first sample (monotonic seconds)."""
    seen: dict[str, float] = {}
    for s in samples:
        for key in s.get("rss", {}):
            seen.setdefault(key, s["t"])
    return seen
