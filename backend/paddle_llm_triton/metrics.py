"""LLM metrics on Triton's metrics endpoint (pb_utils.MetricFamily), with the names and labels that
docs/operations/metrics.md documents.

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

Two name sets (config.pbtxt parameter metrics_names, config_params.py; default both):
- "llm": the llm_* families above;
- "vllm": the same engine values under vLLM's names, types and histogram buckets (vLLM v1's
  Prometheus logger, and Triton's vLLM backend), labelled model_name (the Triton model) and engine
  (the Triton instance, so that instances in separate stub processes keep separate series):
  VLLM_NAMES. They are created when the engine's configuration arrives (on_engine_config: the token
  histograms' 1-2-5 buckets run up to max_model_len).
Every value is computed once, on the metrics thread, and written to every enabled set through a
_Fan: one source of truth, no second bookkeeping.
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

NAME_SETS = ("llm", "vllm")
# vLLM's buckets (vllm/v1/metrics/loggers.py)
VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0]
VLLM_REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                                120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
# name -> Prometheus type, exactly as exposed on :8002 (Triton 2.51 exposes a family under the name
# it was registered with: counters are registered with their _total)
VLLM_NAMES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    # speculative decoding (vLLM's spec-decode counters; 0 while speculative_method is "none")
    "vllm:spec_decode_num_drafts_total": "counter",
    "vllm:spec_decode_num_draft_tokens_total": "counter",
    "vllm:spec_decode_num_accepted_tokens_total": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": "counter",
}


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out, base = [], 1
    while base <= max_value:
        out.extend(v for v in (base, 2 * base, 5 * base) if v <= max_value)
        base *= 10
    return out or [1]


def parse_name_sets(value: str) -> tuple[str, ...]:
    """"llm,vllm" / "vllm" / "llm" (comma or ';' separated, any order) -> the name sets; ValueError
    naming the bad value otherwise (at least one set: the metrics are how operators see the engine)."""
    names = [x.strip().lower() for x in value.replace(";", ",").split(",") if x.strip()]
    bad = [x for x in names if x not in NAME_SETS]
    if bad or not names:
        raise ValueError(f"config.pbtxt parameter metrics_names must list one or both of {', '.join(NAME_SETS)} "
                         f"(comma separated), got {value!r}")
    return tuple(n for n in NAME_SETS if n in names)


class _Fan:
    """One quantity written to the metric of every enabled name set (an empty fan does nothing).
    Every write is an IPC round trip from the stub to the server: a gauge set to the value it holds
    is not written again."""

    __slots__ = ("metrics", "_last")

    def __init__(self, *metrics):
        self.metrics = list(metrics)
        self._last = None

    def attach(self, metric):
        """Add one name set's metric; a gauge attached late starts at the value the fan holds."""
        self.metrics.append(metric)
        if self._last is not None:
            metric.set(self._last)
        return metric

    def set(self, v) -> None:
        if v == self._last and self._last is not None:
            return
        self._last = v
        for m in self.metrics:
            m.set(v)

    def increment(self, v) -> None:
        for m in self.metrics:
            m.increment(v)

    def observe(self, v) -> None:
        for m in self.metrics:
            m.observe(v)


class _ReqTimes:
    __slots__ = ("arrival", "first_token", "last_token", "seen_prompt")

    def __init__(self, arrival: float):
        self.arrival = arrival
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.seen_prompt = False


class LLMMetrics:
    """Owns the metric families and the thread that updates them. All public methods enqueue.

    names: the name sets to expose (NAME_SETS; config.pbtxt metrics_names)."""

    def __init__(self, labels: dict[str, str], restarts_before: int = 0, names=NAME_SETS):
        self.labels = dict(labels)
        self.restarts_before = restarts_before  # llm_engine_restarts (restarts.py)
        self.names = tuple(names)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._reqs: dict[str, _ReqTimes] = {}
        self._preemptions_seen = 0
        self._prefix_seen = (0, 0)  # (queried, hit) prompt tokens already counted
        self._spec_seen = (0, 0, 0, ())  # spec-decode totals already counted (drafts, tokens, accepted, per pos)
        self._prefix_counts = None  # () -> (queried, hit): the block manager's counters
        self._counts: dict = {}  # counter fan -> increments summed over one pass of the queue
        self._cache_config: dict[str, str] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-metrics", daemon=True)
        self._thread.start()
        self._ready.wait(30)

    # -- producers -------------------------------------------------------------------------------
    def on_output(self, out: RequestOutput) -> None:
        self._q.put(("output", out, time.monotonic()))

    def on_state(self, stats: EngineStats) -> None:
        self._q.put(("state", stats))

    def on_engine_config(self, max_model_len: int, block_size: int, num_blocks: int, enable_prefix_caching: bool,
                         cache_dtype: str = "auto", prefix_counts=None) -> None:
        """The engine's KV-cache configuration, once, before it serves: creates the vllm: families
        (token buckets up to max_model_len; vllm:cache_config_info). prefix_counts: a callable
        returning the engine's (prompt tokens looked up in the prefix cache, of which found) counters,
        read on the metrics thread at each state update (vllm:prefix_cache_queries_total / _hits_total;
        the same counters llm_prefix_cache_hit_ratio divides)."""
        self._q.put(("engine_config", dict(max_model_len=int(max_model_len), block_size=int(block_size),
                                           num_blocks=int(num_blocks), enable_prefix_caching=bool(enable_prefix_caching),
                                           cache_dtype=str(cache_dtype)),
                     prefix_counts))

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
    def _family(self, name, desc, kind):
        import triton_python_backend_utils as pb_utils

        f = pb_utils.MetricFamily(name=name, description=desc, kind=kind)
        self._families.append(f)  # a MetricFamily must outlive its Metric objects
        return f

    def _create(self) -> None:
        self._families = []
        # every quantity shared by both name sets: a fan, filled by _create_llm and _create_vllm
        F = _Fan
        self.prompt_tokens, self.generation_tokens, self.preemptions = F(), F(), F()
        self.requests = {r: F() for r in FINISH_REASONS}
        self.running, self.waiting, self.kv_usage = F(), F(), F()
        self.ttft, self.itl, self.e2e, self.queue_time, self.prompt_len, self.gen_len = F(), F(), F(), F(), F(), F()
        self.prefix_queries, self.prefix_hits = F(), F()
        # speculative decoding counters; per position: one fan per position seen, a metric in each
        # (family, labels) of _spec_pos_families (made when the engine first reports the positions)
        self.spec_drafts, self.spec_draft_tokens, self.spec_accepted = F(), F(), F()
        self.spec_pos: list[_Fan] = []
        self._spec_pos_families: list = []
        # llm-only quantities (no vLLM name)
        self.rejected = {r: F() for r in REJECT_REASONS}
        self.timed_out, self.kv_used, self.kv_free, self.prefix_hit, self.healthy, self.restarts = (
            F(), F(), F(), F(), F(), F())
        self.reasoning_tokens = F()
        if "llm" in self.names:
            self._create_llm()

    def _create_llm(self) -> None:
        import triton_python_backend_utils as pb_utils

        MF = pb_utils.MetricFamily
        lb = self.labels

        def counter(fan, name, desc):
            fan.attach(self._family(name, desc, MF.COUNTER).Metric(labels=lb))

        def gauge(fan, name, desc):
            fan.attach(self._family(name, desc, MF.GAUGE).Metric(labels=lb))

        def hist(fan, name, desc, buckets):
            fan.attach(self._family(name, desc, MF.HISTOGRAM).Metric(labels=lb, buckets=buckets))

        counter(self.prompt_tokens, "llm_prompt_tokens_total", "Prompt tokens of requests that started generating")
        counter(self.generation_tokens, "llm_generation_tokens_total", "Generated tokens")
        counter(self.reasoning_tokens, "llm_reasoning_tokens_total", "Generated tokens inside a thinking span "
                                                                     "(counted when their sequence ends)")
        fam = self._family("llm_requests_total", "Finished requests by finish reason", MF.COUNTER)
        for r in FINISH_REASONS:
            self.requests[r].attach(fam.Metric(labels={**lb, "finish_reason": r}))
        counter(self.preemptions, "llm_preemptions_total", "Sequences preempted (KV blocks freed, recomputed later)")
        fam = self._family("llm_requests_rejected_total", "Requests refused before they were queued, by reason "
                                                          "(also counted in llm_requests_total{finish_reason=\"error\"})",
                           MF.COUNTER)
        for r in REJECT_REASONS:
            self.rejected[r].attach(fam.Metric(labels={**lb, "reason": r}))
        counter(self.timed_out, "llm_requests_timed_out_total", "Requests aborted at their deadline (the "
                                                                "request's timeout or max_request_seconds)")
        gauge(self.running, "llm_num_requests_running", "Requests in the running batch")
        gauge(self.waiting, "llm_num_requests_waiting", "Requests waiting to be scheduled")
        gauge(self.kv_used, "llm_kv_cache_used_blocks", "KV blocks referenced by live sequences")
        gauge(self.kv_free, "llm_kv_cache_free_blocks", "KV blocks free (cached blocks no live sequence holds count as free)")
        gauge(self.kv_usage, "llm_kv_cache_usage_ratio", "Used KV blocks / all KV blocks")
        gauge(self.prefix_hit, "llm_prefix_cache_hit_ratio", "Prompt tokens served from the prefix cache / prompt tokens")
        gauge(self.healthy, "llm_engine_healthy", "1 while the instance's engine serves; 0 after an engine failure "
                                                  "(Triton 2.51 keeps the model ready: alert on this)")
        # a gauge set to the supervisor's count: Triton keeps a metric series across a model's reload
        # (same name and labels), so a counter incremented at each start would add the counts up
        gauge(self.restarts, "llm_engine_restarts", "Times the launcher's supervisor reloaded this model after "
                                                    "a failure, since the launcher started")
        hist(self.ttft, "llm_time_to_first_token_seconds", "Arrival to first generated token", _LATENCY_BUCKETS)
        hist(self.itl, "llm_inter_token_latency_seconds", "Time between generated tokens", _LATENCY_BUCKETS)
        hist(self.e2e, "llm_e2e_request_latency_seconds", "Arrival to finish", _LATENCY_BUCKETS)
        hist(self.queue_time, "llm_request_queue_time_seconds", "Arrival to first scheduled", _LATENCY_BUCKETS)
        hist(self.prompt_len, "llm_request_prompt_tokens", "Prompt length of finished requests", _TOKEN_BUCKETS)
        hist(self.gen_len, "llm_request_generation_tokens", "Generated tokens of finished requests", _TOKEN_BUCKETS)
        self._create_llm_spec(counter, MF, lb)
        for r in FINISH_REASONS:
            self.requests[r].increment(0)
        for r in REJECT_REASONS:
            self.rejected[r].increment(0)
        self.timed_out.increment(0)
        self.reasoning_tokens.increment(0)
        self.kv_free.set(0)
        self.healthy.set(1)
        self.restarts.set(self.restarts_before)

    def _create_llm_spec(self, counter, MF, lb: dict) -> None:
        """The llm_spec_decode_* counters (speculative decoding)."""
        counter(self.spec_drafts, "llm_spec_decode_num_drafts_total",
                "Speculative decoding: verify steps of a sequence with draft tokens")
        counter(self.spec_draft_tokens, "llm_spec_decode_num_draft_tokens_total",
                "Speculative decoding: draft tokens proposed")
        counter(self.spec_accepted, "llm_spec_decode_num_accepted_tokens_total",
                "Speculative decoding: draft tokens accepted")
        self._spec_pos_family(self._family("llm_spec_decode_num_accepted_tokens_per_pos_total",
                                           "Speculative decoding: draft tokens accepted, by position in the draft "
                                           "(label position, 0-based)", MF.COUNTER), lb)
        for fan in (self.spec_drafts, self.spec_draft_tokens, self.spec_accepted):
            fan.increment(0)

    def _create_vllm_spec(self, add, C, lb: dict, made: list) -> None:
        """vLLM's spec-decode counters."""
        add(self.spec_drafts, "vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", C).increment(0)
        add(self.spec_draft_tokens, "vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.",
            C).increment(0)
        add(self.spec_accepted, "vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
            C).increment(0)
        made.append("vllm:spec_decode_num_accepted_tokens_per_pos_total")
        self._spec_pos_family(self._family("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                           "Accepted tokens per draft position.", C), lb)

    def _create_vllm(self, cfg: dict) -> None:
        """The vllm: families (VLLM_NAMES), appended to the fans the llm_ set already writes."""
        import triton_python_backend_utils as pb_utils

        MF = pb_utils.MetricFamily
        lb = {"model_name": self.labels.get("model", ""), "engine": self.labels.get("instance", "0")}
        made = []

        def add(fan, name, desc, kind, labels=lb, buckets=None):
            made.append(name)
            fam = self._family(name, desc, kind)
            m = fam.Metric(labels=labels) if buckets is None else fam.Metric(labels=labels, buckets=buckets)
            fan.attach(m)
            return m

        G, C, H = MF.GAUGE, MF.COUNTER, MF.HISTOGRAM
        add(self.running, "vllm:num_requests_running", "Number of requests in model execution batches.", G)
        add(self.waiting, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", G)
        add(self.kv_usage, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", G)
        add(self.kv_usage, "vllm:gpu_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage. DEPRECATED: use vllm:kv_cache_usage_perc.", G)
        info = {**lb, "block_size": str(cfg["block_size"]), "num_gpu_blocks": str(cfg["num_blocks"]),
                "enable_prefix_caching": str(cfg["enable_prefix_caching"]),
                "cache_dtype": cfg.get("cache_dtype", "auto")}
        add(_Fan(), "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", G, labels=info).set(1)
        add(self.prompt_tokens, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", C)
        add(self.generation_tokens, "vllm:generation_tokens_total", "Number of generation tokens processed.", C)
        fam = self._family("vllm:request_success_total", "Count of successfully processed requests.", C)
        made.append("vllm:request_success_total")
        for r in FINISH_REASONS:
            m = fam.Metric(labels={**lb, "finished_reason": r})
            m.increment(0)
            self.requests[r].attach(m)
        add(self.preemptions, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", C)
        add(self.prefix_queries, "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.", C).increment(0)
        add(self.prefix_hits, "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.", C).increment(0)
        self._create_vllm_spec(add, C, lb, made)
        add(self.ttft, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", H,
            buckets=VLLM_TTFT_BUCKETS)
        add(self.itl, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", H,
            buckets=VLLM_ITL_BUCKETS)
        add(self.itl, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds. "
            "DEPRECATED: use vllm:inter_token_latency_seconds.", H, buckets=VLLM_ITL_BUCKETS)
        add(self.e2e, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", H,
            buckets=VLLM_REQUEST_LATENCY_BUCKETS)
        add(self.queue_time, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
            H, buckets=VLLM_REQUEST_LATENCY_BUCKETS)
        token_buckets = build_1_2_5_buckets(cfg["max_model_len"])
        add(self.prompt_len, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", H,
            buckets=token_buckets)
        add(self.gen_len, "vllm:request_generation_tokens", "Number of generation tokens processed.", H,
            buckets=token_buckets)
        assert sorted(made) == sorted(VLLM_NAMES), set(made) ^ set(VLLM_NAMES)

    def _run(self) -> None:
        try:
            self._create()
        except Exception:
            log.exception("LLM metrics unavailable")
            self._ready.set()
            return
        self._ready.set()
        # One pass takes what is queued: counters are incremented once per pass with the sum, and of
        # several engine states only the last is written (gauges; the preemption counter is a total).
        while True:
            batch = [self._q.get()]
            while len(batch) < 4096:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            last_state = max((i for i, it in enumerate(batch) if it is not None and it[0] == "state"), default=-1)
            for i, item in enumerate(batch):
                if item is None:
                    self._flush_counts()
                    self._release()
                    return
                if item[0] == "state" and i != last_state:
                    continue
                try:
                    self._apply(item)
                except Exception:
                    log.exception("metric update failed")
            self._flush_counts()

    def _release(self) -> None:
        """Drop every Metric, then every MetricFamily, here on the metrics thread while the stub is
        alive (shutdown() from finalize(), which then collects any cycle). Why: one left for
        interpreter teardown is destroyed inside the stub's own destructor, and its clean-up (taking
        the metric off the server) reaches for the stub being destroyed (python_backend's
        MetricFamily destructor; the same way an `ensemble` response sender crashed every unload)."""
        def clear(v) -> None:
            if isinstance(v, _Fan):
                v.metrics.clear()
            elif isinstance(v, dict):
                for x in v.values():
                    clear(x)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    clear(x)

        for v in list(vars(self).values()):
            clear(v)
        self._info = None
        self._spec_pos_families = []
        self._families = []  # the families last: a MetricFamily must outlive its Metric objects

    def _count(self, fan: "_Fan", n: int) -> None:
        """Add n to a counter at the end of this pass (one IPC per counter per pass, not per output)."""
        self._counts[fan] = self._counts.get(fan, 0) + n

    def _flush_counts(self) -> None:
        counts, self._counts = self._counts, {}
        for fan, n in counts.items():
            try:
                fan.increment(n)
            except Exception:
                log.exception("metric update failed")

    def _apply(self, item) -> None:
        kind = item[0]
        if kind == "output":
            self._output(item[1], item[2])
        elif kind == "state":
            self._state(item[1])
        elif kind == "engine_config":
            self._cache_config, self._prefix_counts = item[1], item[2]
            if "vllm" in self.names:
                self._create_vllm(item[1])
        elif kind == "healthy":
            self.healthy.set(item[1])
        elif kind == "info":
            if "llm" not in self.names:
                return
            import triton_python_backend_utils as pb_utils

            fam = self._family("llm_engine_info", "1, labelled with the instance's device, dtypes, kernels, "
                                                  "quantization, tensor_parallel_size and admission limits",
                               pb_utils.MetricFamily.GAUGE)
            self._info = fam.Metric(labels={**self.labels, **item[1]})
            self._info.set(1)
        elif kind == "rejected":
            self.requests["error"].increment(1)
            self.rejected.get(item[1], self.rejected["internal"]).increment(1)
        elif kind == "flush":
            self._flush_counts()
            item[1].set()

    def _spec_pos_family(self, fam, labels: dict) -> None:
        """Register a per-position family; the positions already known get their metric in it."""
        self._spec_pos_families.append((fam, labels))
        for i, fan in enumerate(self.spec_pos):
            fan.attach(fam.Metric(labels={**labels, "position": str(i)})).increment(0)

    def _spec_state(self, s: EngineStats) -> None:
        """Speculative-decoding counters: increments since the last state (the engine's are totals)."""
        seen = self._spec_seen
        for fan, now, before in ((self.spec_drafts, s.spec_num_drafts, seen[0]),
                                 (self.spec_draft_tokens, s.spec_num_draft_tokens, seen[1]),
                                 (self.spec_accepted, s.spec_num_accepted_tokens, seen[2])):
            if now > before:
                fan.increment(now - before)
        per_pos = tuple(s.spec_accepted_per_pos)
        while len(self.spec_pos) < len(per_pos):
            fan = _Fan()
            i = len(self.spec_pos)
            for fam, labels in self._spec_pos_families:
                fan.attach(fam.Metric(labels={**labels, "position": str(i)})).increment(0)
            self.spec_pos.append(fan)
        old = seen[3] + (0,) * (len(per_pos) - len(seen[3]))
        for fan, now, before in zip(self.spec_pos, per_pos, old):
            if now > before:
                fan.increment(now - before)
        self._spec_seen = (max(s.spec_num_drafts, seen[0]), max(s.spec_num_draft_tokens, seen[1]),
                           max(s.spec_num_accepted_tokens, seen[2]), tuple(max(a, b) for a, b in zip(per_pos, old)))

    def _state(self, s: EngineStats) -> None:
        self._spec_state(s)
        if s.num_preemptions_total > self._preemptions_seen:
            self.preemptions.increment(s.num_preemptions_total - self._preemptions_seen)
            self._preemptions_seen = s.num_preemptions_total
        self.running.set(s.running)
        self.waiting.set(s.waiting)
        self.kv_used.set(s.kv_used_blocks)
        self.kv_free.set(s.kv_free_blocks)
        self.kv_usage.set(s.kv_usage_ratio)
        self.prefix_hit.set(s.prefix_cache_hit_ratio)
        if self._prefix_counts is not None:
            queried, hit = self._prefix_counts()
            q0, h0 = self._prefix_seen
            if queried > q0:
                self.prefix_queries.increment(queried - q0)
            if hit > h0:
                self.prefix_hits.increment(hit - h0)
            self._prefix_seen = (max(queried, q0), max(hit, h0))

    def _output(self, out: RequestOutput, t: float) -> None:
        r = self._reqs.get(out.request_id)
        if r is None:
            r = self._reqs[out.request_id] = _ReqTimes(out.arrival_time or t)
        n = len(out.token_ids)
        if n and not r.seen_prompt:
            r.seen_prompt = True
            self._count(self.prompt_tokens, out.num_prompt_tokens)
            if out.first_scheduled_time is not None:
                self.queue_time.observe(max(0.0, out.first_scheduled_time - r.arrival))
        if n:
            self._count(self.generation_tokens, n)
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
        if out.sequence_finished and out.num_reasoning_tokens:  # once per sequence, its total
            self._count(self.reasoning_tokens, out.num_reasoning_tokens)
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
