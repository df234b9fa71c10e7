"""Load statistics of client_examples/load_generator.py: the per-request record its workers fill in
and the summary of a finished load (throughput, TTFT, inter-token and end-to-end latency, seconds).
Also used by benchmarks/compare.py for the systems it drives itself, so every system is measured the
same way. numpy only: no gRPC client needed."""

from __future__ import annotations

import numpy as np


class RequestRecord:
    __slots__ = ("index", "sent", "times", "tokens", "final", "error", "cut", "finish_reason",
                 "prompt_tokens", "text_len")

    def __init__(self, index: int):
        self.index = index
        self.sent = 0.0
        self.times: list[float] = []   # arrival time of each response that carries tokens
        self.tokens: list[int] = []    # tokens in that response
        self.final: float | None = None
        self.error: str | None = None
        self.cut = False
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.text_len = 0


def percentiles(values, ps=(50, 90, 99)) -> dict:
    if not values:
        return {"count": 0, "mean": None, **{f"p{p}": None for p in ps}}
    a = np.asarray(values, dtype=np.float64)
    return {"count": int(a.size), "mean": float(a.mean()), **{f"p{p}": float(np.percentile(a, p)) for p in ps}}


def decode_window(records) -> float:
    """Seconds during which at least one request was between its first and its last token response
    (the union of the [first, last] intervals)."""
    spans = sorted((r.times[0], r.times[-1]) for r in records if len(r.times) > 1)
    total, cur_start, cur_end = 0.0, None, None
    for a, b in spans:
        if cur_end is None or a > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def summarize_records(records, t0: float, t_end: float, prompt_tokens: bool = True) -> dict:
    """Throughput and latency statistics of finished load records (RequestRecord-like objects with
    sent, times, tokens, final, error, cut); t0: when the first request could be sent. Also used by
    benchmarks/compare.py for systems it drives itself, so every system is measured the same way."""
    done = [r for r in records if r.error is None and not r.cut and r.final is not None]
    failed = [r for r in records if r.error is not None]
    cut = [r for r in records if r.cut]
    # Wall time: first send to the last event of any request (a completion, or the last tokens of a
    # request cut at the time cap), so that every counted token lies inside it.
    last = max([r.final or (r.times[-1] if r.times else r.sent) for r in records] or [t_end])
    wall = max(last - t0, 1e-9)
    total_tokens = sum(sum(r.tokens) for r in records)
    done_tokens = sum(sum(r.tokens) for r in done)

    ttft, itl, e2e, decode_rate = [], [], [], []
    for r in done:
        e2e.append(r.final - r.sent)
        if not r.times:
            continue
        ttft.append(r.times[0] - r.sent)
        for k in range(1, len(r.times)):
            per_token = (r.times[k] - r.times[k - 1]) / r.tokens[k]
            itl.extend([per_token] * r.tokens[k])
        span = r.times[-1] - r.times[0]
        if len(r.times) > 1 and span > 0:
            decode_rate.append(sum(r.tokens[1:]) / span)

    reasons: dict = {}
    for r in done:
        if r.finish_reason:
            reasons[r.finish_reason] = reasons.get(r.finish_reason, 0) + 1
    out_per_req = [sum(r.tokens) for r in done]
    window = decode_window(records)
    decode_tokens = sum(sum(r.tokens[1:]) for r in records if len(r.times) > 1)
    return {
        "requests_sent": len(records),
        "requests_done": len(done),
        "requests_failed": len(failed),
        "requests_cut_at_time_cap": len(cut),
        "total_output_tokens": total_tokens,
        "output_tokens_of_done_requests": done_tokens,
        "total_prompt_tokens": sum(r.prompt_tokens or 0 for r in done) if prompt_tokens else None,
        "output_tokens_per_request": percentiles(out_per_req),
        "wall_time_s": wall,
        "output_tokens_per_s": total_tokens / wall,
        "requests_per_s": len(done) / wall,
        "decode_window_s": window,
        "decode_tokens_per_s": decode_tokens / window if window > 0 else None,
        "decode_tokens_per_s_per_request": percentiles(decode_rate),
        "ttft_s": percentiles(ttft),
        "itl_s": percentiles(itl),
        "e2e_latency_s": percentiles(e2e),
        "finish_reasons": reasons or None,
        "errors": [f"request {r.index}: {r.error}" for r in failed[:5]],
    }
