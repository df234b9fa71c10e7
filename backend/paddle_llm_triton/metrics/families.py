"""The metric families of one llm instance and the fans that write each quantity to them: what is
exposed (names, types, labels, buckets: names.py), created and released on the metrics thread.

A `MetricSet` is made by LLMMetrics on its thread (every pb_utils.MetricFamily call happens there)
and holds one `Fan` per quantity; the llm_ families are created at once (metrics_names has "llm"),
the vllm: ones when the engine's configuration arrives (add_vllm), llm_engine_info when the
instance's description does (add_info).
"""

from __future__ import annotations

from paddle_llm_triton.metrics.names import (FINISH_REASONS, LLM_LATENCY_BUCKETS, LLM_TOKEN_BUCKETS, LORA_INFO_NAME,
                                             REJECT_REASONS, VLLM_ITL_BUCKETS, VLLM_NAMES,
                                             VLLM_REQUEST_LATENCY_BUCKETS, VLLM_TTFT_BUCKETS, build_1_2_5_buckets)


class Fan:
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


class MetricSet:
    """The families and fans of one instance. labels: model / version / instance; names: the enabled
    name sets (names.NAME_SETS); restarts_before: the supervisor's reload count (llm_engine_restarts).
    Construct it on the metrics thread only; raises what pb_utils raises for a family it cannot make."""

    def __init__(self, labels: dict[str, str], names, restarts_before: int):
        self.labels, self.names, self.restarts_before = labels, tuple(names), restarts_before
        self._families = []
        self._info = None
        # every quantity shared by both name sets: a fan, filled by _create_llm and _create_vllm
        F = Fan
        self.prompt_tokens, self.generation_tokens, self.preemptions = F(), F(), F()
        self.requests = {r: F() for r in FINISH_REASONS}
        self.running, self.waiting, self.kv_usage = F(), F(), F()
        self.ttft, self.itl, self.e2e, self.queue_time, self.prompt_len, self.gen_len = F(), F(), F(), F(), F(), F()
        self.params_n, self.params_max_tokens = F(), F()  # vLLM only
        self.prefix_queries, self.prefix_hits = F(), F()
        # speculative decoding counters; per position: one fan per position seen, a metric in each
        # (family, labels) of _spec_pos_families (made when the engine first reports the positions)
        self.spec_drafts, self.spec_draft_tokens, self.spec_accepted = F(), F(), F()
        self.spec_pos: list[Fan] = []
        self._spec_pos_families: list = []
        # llm-only quantities (no vLLM name)
        self.rejected = {r: F() for r in REJECT_REASONS}
        self.timed_out, self.kv_used, self.kv_free, self.prefix_hit, self.healthy, self.restarts = (
            F(), F(), F(), F(), F(), F())
        self.reasoning_tokens = F()
        # vLLM's vllm:lora_requests_info (LoRA on): one series at a time, replaced when its labels change
        self._lora_family = None
        self._lora_metric = None
        self._lora_labels: dict | None = None
        if "llm" in self.names:
            self._create_llm()

    def _family(self, name, desc, kind):
        import triton_python_backend_utils as pb_utils

        f = pb_utils.MetricFamily(name=name, description=desc, kind=kind)
        self._families.append(f)  # a MetricFamily must outlive its Metric objects
        return f

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
        hist(self.ttft, "llm_time_to_first_token_seconds", "Arrival to first generated token", LLM_LATENCY_BUCKETS)
        hist(self.itl, "llm_inter_token_latency_seconds", "Time between generated tokens", LLM_LATENCY_BUCKETS)
        hist(self.e2e, "llm_e2e_request_latency_seconds", "Arrival to finish", LLM_LATENCY_BUCKETS)
        hist(self.queue_time, "llm_request_queue_time_seconds", "Arrival to first scheduled", LLM_LATENCY_BUCKETS)
        hist(self.prompt_len, "llm_request_prompt_tokens", "Prompt length of finished requests", LLM_TOKEN_BUCKETS)
        hist(self.gen_len, "llm_request_generation_tokens", "Generated tokens of finished requests", LLM_TOKEN_BUCKETS)
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

    def add_vllm(self, cfg: dict) -> None:
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
        add(Fan(), "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", G, labels=info).set(1)
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
        add(self.params_n, "vllm:request_params_n", "Histogram of the n request parameter.", H,
            buckets=[1, 2, 5, 10, 20])
        add(self.params_max_tokens, "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
            H, buckets=token_buckets)
        assert sorted(made) == sorted(VLLM_NAMES), set(made) ^ set(VLLM_NAMES)

    def add_info(self, info: dict[str, str]) -> None:
        """The gauge llm_engine_info (value 1) labelled with `info` (LLMMetrics.on_engine_info)."""
        import triton_python_backend_utils as pb_utils

        fam = self._family("llm_engine_info", "1, labelled with the instance's device, dtypes, kernels, "
                                              "quantization, tensor_parallel_size and admission limits",
                           pb_utils.MetricFamily.GAUGE)
        self._info = fam.Metric(labels={**self.labels, **info})
        self._info.set(1)

    def set_lora_info(self, max_lora: int, running: tuple, waiting: tuple, now: float) -> None:
        """vLLM's gauge vllm:lora_requests_info: labels running_lora_adapters / waiting_lora_adapters (the
        adapters of running / waiting requests, names joined by ",", as vLLM joins them) and max_lora,
        value `now` (wall-clock seconds: vLLM sets it to the time of each update, and readers such as
        the Gateway API inference extension take the series with the latest value). A change of labels
        starts another series; the Metric of the old one is dropped, but the Python backend keeps its
        last value on the endpoint (seen 2026-12-06), as vLLM keeps every label set it has shown."""
        import triton_python_backend_utils as pb_utils

        if self._lora_family is None:
            self._lora_family = self._family(LORA_INFO_NAME, "Running stats on lora requests.",
                                             pb_utils.MetricFamily.GAUGE)
        labels = {"model_name": self.labels.get("model", ""), "engine": self.labels.get("instance", "0"),
                  "max_lora": str(max_lora), "running_lora_adapters": ",".join(running),
                  "waiting_lora_adapters": ",".join(waiting)}
        if labels != self._lora_labels:
            self._lora_metric = None  # dropped here, on the metrics thread: Triton deletes the series
            self._lora_metric = self._lora_family.Metric(labels=labels)
            self._lora_labels = labels
        self._lora_metric.set(now)

    def _spec_pos_family(self, fam, labels: dict) -> None:
        """Register a per-position family; the positions already known get their metric in it."""
        self._spec_pos_families.append((fam, labels))
        for i, fan in enumerate(self.spec_pos):
            fan.attach(fam.Metric(labels={**labels, "position": str(i)})).increment(0)

    def add_spec_positions(self, n: int) -> None:
        """Per-position spec-decode counters up to n positions: a fan per new position, a metric of it
        (at 0) in every per-position family."""
        while len(self.spec_pos) < n:
            fan = Fan()
            i = len(self.spec_pos)
            for fam, labels in self._spec_pos_families:
                fan.attach(fam.Metric(labels={**labels, "position": str(i)})).increment(0)
            self.spec_pos.append(fan)

    def release(self) -> None:
        """Drop every Metric, then every MetricFamily, here on the metrics thread while the stub is
        alive (LLMMetrics.shutdown() from finalize(), which then collects any cycle). Why: one left for
        interpreter teardown is destroyed inside the stub's own destructor, and its clean-up (taking
        the metric off the server) reaches for the stub being destroyed (python_backend's
        MetricFamily destructor; the same way an `ensemble` response sender crashed every unload)."""
        def clear(v) -> None:
            if isinstance(v, Fan):
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
        self._lora_metric = None
        self._spec_pos_families = []
        self._families = []  # the families last: a MetricFamily must outlive its Metric objects
