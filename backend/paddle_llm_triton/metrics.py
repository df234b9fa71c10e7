"""LLM metrics on Triton's metrics endpoint (pb_utils.MetricFamily), with the names and labels that
README "Metrics" documents.

Every MetricFamily call happens on one thread ("llm-metrics"), fed by a queue: tritonserver 2.51
crashed when metrics were updated from several threads at once, and the engine thread must not
wait on metric IPC. Producers (engine thread, responder thread, execute()) only enqueue.

Labels on every metric: model, version, instance (plus finish_reason on llm_requests_total, reason
on llm_requests_rejected_total, and device / dtype / kv_cache_dtype / kernels / quantization /
tensor_parallel_size / max_num_seqs / max_num_waiting on llm_engine_info).
Every request `llm` refuses (before or when the engine would queue it) counts once in
llm_requests_total{finish_reason="error"} and once in llm_requests_rejected_total{reason}; a request
aborted at its deadline counts in llm_requests_total{finish_reason="abort"} and in
llm_requests_timed_out_total.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from paddle_llm_engine.outputs import EngineStats, RequestOutput

log = logging.getLogger(__name__)

FINISH_REASONS = ("stop", "length", "abort", "error")
# llm_requests_rejected_total{reason}: queue_full (max_num_waiting reached), invalid (bad input),
# not_serving (the engine failed earlier), draining (the server is shutting down), internal (an
# unexpected error while reading the request); all registered at 0 so that rates exist from the start
REJECT_REASONS = ("queue_full", "invalid", "not_serving", "draining", "internal")
_LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]


class _ReqTimes:
    __slots__ = ("arrival", "first_token", "last_token", "seen_prompt")

    def __init__(self, arrival: float):
        self.arrival = arrival
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.seen_prompt = False


class LLMMetrics:
    """Owns the metric families and the thread that updates them. All public methods enqueue."""

    def __init__(self, labels: dict[str, str], restarts_before: int = 0):
        self.labels = dict(labels)
        self.restarts_before = restarts_before  # llm_engine_restarts (restarts.py)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._reqs: dict[str, _ReqTimes] = {}
        self._preemptions_seen = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-metrics", daemon=True)
        self._thread.start()
        self._ready.wait(30)

    # -- producers -------------------------------------------------------------------------------
    def on_output(self, out: RequestOutput) -> None:
        self._q.put(("output", out, time.monotonic()))

    def on_state(self, stats: EngineStats) -> None:
        self._q.put(("state", stats))

    def on_engine_failed(self) -> None:
        """The engine stopped after a failure: llm_engine_healthy drops to 0."""
        self._q.put(("healthy", 0))

    def on_engine_info(self, info: dict[str, str]) -> None:
        """What the instance runs on, as labels of the gauge llm_engine_info (value 1): device
        ("cpu", "gcu:1"), dtype, kv_cache_dtype, kernels (the optional kernels that are on, ';'-joined,
        or "composed"), quantization ("none", "wint8" or "wint4"), tensor_parallel_size, and the admission
        limits max_num_seqs and max_num_waiting (LLMEngine.info())."""
        self._q.put(("info", dict(info)))

    def on_rejected(self, reason: str) -> None:
        """A request refused before it reached the engine; reason: one of REJECT_REASONS (refusals
        by the engine itself arrive through on_output with RequestOutput.rejected set)."""
        self._q.put(("rejected", reason))

    def shutdown(self) -> None:
        self._q.put(None)
        self._thread.join(5)

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything enqueued so far is applied (tests, shutdown)."""
        ev = threading.Event()
        self._q.put(("flush", ev))
        ev.wait(timeout)

    # -- metrics thread --------------------------------------------------------------------------
    def _create(self) -> None:
        import triton_python_backend_utils as pb_utils

        MF = pb_utils.MetricFamily
        lb = self.labels
        self._families = []  # a MetricFamily must outlive its Metric objects

        def family(name, desc, kind):
            f = MF(name=name, description=desc, kind=kind)
            self._families.append(f)
            return f

        def counter(name, desc):
            return family(name, desc, MF.COUNTER).Metric(labels=lb)

        def gauge(name, desc):
            return family(name, desc, MF.GAUGE).Metric(labels=lb)

        def hist(name, desc, buckets):
            return family(name, desc, MF.HISTOGRAM).Metric(labels=lb, buckets=buckets)

        self.prompt_tokens = counter("llm_prompt_tokens_total", "Prompt tokens of requests that started generating")
        self.generation_tokens = counter("llm_generation_tokens_total", "Generated tokens")
        fam = family("llm_requests_total", "Finished requests by finish reason", MF.COUNTER)
        self.requests = {r: fam.Metric(labels={**lb, "finish_reason": r}) for r in FINISH_REASONS}
        self.preemptions = counter("llm_preemptions_total", "Sequences preempted (KV blocks freed, recomputed later)")
        fam = family("llm_requests_rejected_total", "Requests refused before they were queued, by reason "
                                                    "(also counted in llm_requests_total{finish_reason=\"error\"})",
                     MF.COUNTER)
        self.rejected = {r: fam.Metric(labels={**lb, "reason": r}) for r in REJECT_REASONS}
        self.timed_out = counter("llm_requests_timed_out_total", "Requests aborted at their deadline (the "
                                                                 "request's timeout or max_request_seconds)")
        self.running = gauge("llm_num_requests_running", "Requests in the running batch")
        self.waiting = gauge("llm_num_requests_waiting", "Requests waiting to be scheduled")
        self.kv_used = gauge("llm_kv_cache_used_blocks", "KV blocks referenced by live sequences")
        self.kv_free = gauge("llm_kv_cache_free_blocks", "KV blocks free (cached blocks no live sequence holds count as free)")
        self.kv_usage = gauge("llm_kv_cache_usage_ratio", "Used KV blocks / all KV blocks")
        self.prefix_hit = gauge("llm_prefix_cache_hit_ratio", "Prompt tokens served from the prefix cache / prompt tokens")
        self.healthy = gauge("llm_engine_healthy", "1 while the instance's engine serves; 0 after an engine failure "
                                                   "(Triton 2.51 keeps the model ready: alert on this)")
        # a gauge set to the supervisor's count: Triton keeps a metric series across a model's reload
        # (same name and labels), so a counter incremented at each start would add the counts up
        self.restarts = gauge("llm_engine_restarts", "Times the launcher's supervisor reloaded this model after "
                                                     "a failure, since the launcher started")
        self.ttft = hist("llm_time_to_first_token_seconds", "Arrival to first generated token", _LATENCY_BUCKETS)
        self.itl = hist("llm_inter_token_latency_seconds", "Time between generated tokens", _LATENCY_BUCKETS)
        self.e2e = hist("llm_e2e_request_latency_seconds", "Arrival to finish", _LATENCY_BUCKETS)
        self.queue_time = hist("llm_request_queue_time_seconds", "Arrival to first scheduled", _LATENCY_BUCKETS)
        self.prompt_len = hist("llm_request_prompt_tokens", "Prompt length of finished requests", _TOKEN_BUCKETS)
        self.gen_len = hist("llm_request_generation_tokens", "Generated tokens of finished requests", _TOKEN_BUCKETS)
        for r in FINISH_REASONS:
            self.requests[r].increment(0)
        for r in REJECT_REASONS:
            self.rejected[r].increment(0)
        self.timed_out.increment(0)
        self.kv_free.set(0)
        self.healthy.set(1)
        self.restarts.set(self.restarts_before)

    def _run(self) -> None:
        try:
            self._create()
        except Exception:
            log.exception("LLM metrics unavailable")
            self._ready.set()
            return
        self._ready.set()
        while True:
            item = self._q.get()
            if item is None:
                return
            try:
                self._apply(item)
            except Exception:
                log.exception("metric update failed")

    def _apply(self, item) -> None:
        kind = item[0]
        if kind == "output":
            self._output(item[1], item[2])
        elif kind == "state":
            s: EngineStats = item[1]
            if s.num_preemptions_total > self._preemptions_seen:
                self.preemptions.increment(s.num_preemptions_total - self._preemptions_seen)
                self._preemptions_seen = s.num_preemptions_total
            self.running.set(s.running)
            self.waiting.set(s.waiting)
            self.kv_used.set(s.kv_used_blocks)
            self.kv_free.set(s.kv_free_blocks)
            self.kv_usage.set(s.kv_usage_ratio)
            self.prefix_hit.set(s.prefix_cache_hit_ratio)
        elif kind == "healthy":
            self.healthy.set(item[1])
        elif kind == "info":
            import triton_python_backend_utils as pb_utils

            fam = pb_utils.MetricFamily(name="llm_engine_info", kind=pb_utils.MetricFamily.GAUGE,
                                        description="1, labelled with the instance's device, dtypes, kernels, "
                                                    "quantization, tensor_parallel_size and admission limits")
            self._families.append(fam)
            self._info = fam.Metric(labels={**self.labels, **item[1]})
            self._info.set(1)
        elif kind == "rejected":
            self.requests["error"].increment(1)
            self.rejected.get(item[1], self.rejected["internal"]).increment(1)
        elif kind == "flush":
            item[1].set()

    def _output(self, out: RequestOutput, t: float) -> None:
        r = self._reqs.get(out.request_id)
        if r is None:
            r = self._reqs[out.request_id] = _ReqTimes(out.arrival_time or t)
        n = len(out.token_ids)
        if n and not r.seen_prompt:
            r.seen_prompt = True
            self.prompt_tokens.increment(out.num_prompt_tokens)
            if out.first_scheduled_time is not None:
                self.queue_time.observe(max(0.0, out.first_scheduled_time - r.arrival))
        if n:
            self.generation_tokens.increment(n)
            if r.first_token is None:
                r.first_token = t
                self.ttft.observe(t - r.arrival)
                n -= 1  # the first token has no predecessor
            if out.sequence_index == 0:  # n > 1: the inter-token gaps of the first sequence
                if n and r.last_token is not None:
                    gap = (t - r.last_token) / n
                    for _ in range(n):
                        self.itl.observe(gap)
                r.last_token = t
        if out.finished:
            del self._reqs[out.request_id]
            self.requests.get(out.finish_reason or "error", self.requests["error"]).increment(1)
            if out.rejected:
                self.rejected.get(out.rejected, self.rejected["internal"]).increment(1)
            if out.timed_out:
                self.timed_out.increment(1)
            if out.finish_reason != "error":
                self.e2e.observe(t - r.arrival)
                self.prompt_len.observe(out.num_prompt_tokens)
                self.gen_len.observe(out.num_output_tokens)
