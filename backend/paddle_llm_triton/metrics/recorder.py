"""`LLMMetrics`: the metrics thread of an llm instance and what it computes from the engine's
outputs and states (latencies, token counts, increments of the engine's totals). Producers only
enqueue; the families it writes through are a families.MetricSet made on this thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from paddle_llm_engine.outputs import EngineStats, RequestOutput
from paddle_llm_triton.metrics.families import Fan, MetricSet
from paddle_llm_triton.metrics.names import LORA_INFO_REFRESH_S, NAME_SETS

log = logging.getLogger("paddle_llm_triton.metrics")

# Counter increments are summed and written at most this often (and before a finished request's own
# counters, and when the queue goes quiet): each write is an IPC round trip to tritonserver, and at
# one stream a pass of the queue holds one output, so per-pass writes cost two IPCs per token. A
# Prometheus scrape (>= 1 s apart) cannot tell the difference.
COUNTER_FLUSH_S = 0.1


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
        self.restarts_before = restarts_before  # llm_engine_restarts (lifecycle/restarts.py)
        self.names = tuple(names)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._reqs: dict[str, _ReqTimes] = {}
        self._preemptions_seen = 0
        self._prefix_seen = (0, 0)  # (queried, hit) prompt tokens already counted
        self._spec_seen = (0, 0, 0, ())  # spec-decode totals already counted (drafts, tokens, accepted, per pos)
        self._prefix_counts = None  # () -> (queried, hit): the block manager's counters
        self._counts: dict = {}  # counter fan -> increments summed over one pass of the queue
        self._cache_config: dict[str, str] | None = None
        self._lora_seen: tuple | None = None  # (labels, time.monotonic()) of the last LoRA gauge write
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-metrics", daemon=True)
        self._thread.start()
        self._ready.wait(30)

    # -- producers -------------------------------------------------------------------------------
    def on_output(self, out: RequestOutput) -> None:
        """An engine output (engine thread): token counts and latencies, finish reasons."""
        self._q.put(("output", out, time.monotonic()))

    def on_state(self, stats: EngineStats) -> None:
        """The engine's state after a step: gauges, and the increments of its totals."""
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
        """Apply what is queued, release every metric and family on the metrics thread, join it (<= 5 s)."""
        self._q.put(None)
        self._thread.join(5)

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything enqueued so far is applied (tests, shutdown)."""
        ev = threading.Event()
        self._q.put(("flush", ev))
        ev.wait(timeout)

    # -- metrics thread --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.fans = MetricSet(self.labels, self.names, self.restarts_before)
        except Exception:
            log.exception("LLM metrics unavailable")
            self._ready.set()
            return
        self._ready.set()
        # One pass takes what is queued: counter increments are summed (written every COUNTER_FLUSH_S
        # at most), and of several engine states only the last is written (gauges; the preemption
        # counter is a total).
        next_flush = time.monotonic() + COUNTER_FLUSH_S
        while True:
            try:
                wait = None if not self._counts else max(0.0, next_flush - time.monotonic())
                batch = [self._q.get(timeout=wait)]
            except queue.Empty:  # quiet: write what is pending now
                self._flush_counts()
                next_flush = time.monotonic() + COUNTER_FLUSH_S
                continue
            while len(batch) < 4096:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            last_state = max((i for i, it in enumerate(batch) if it is not None and it[0] == "state"), default=-1)
            for i, item in enumerate(batch):
                if item is None:
                    self._flush_counts()
                    self.fans.release()
                    return
                if item[0] == "state" and i != last_state:
                    continue
                try:
                    self._apply(item)
                except Exception:
                    log.exception("metric update failed")
            if time.monotonic() >= next_flush:
                self._flush_counts()
                next_flush = time.monotonic() + COUNTER_FLUSH_S

    def _count(self, fan: "Fan", n: int) -> None:
        """Add n to a counter when pending increments are next written: every COUNTER_FLUSH_S at most,
        when the queue goes quiet, or before the next finished request's counters (one IPC per
        counter per write, not per output)."""
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
                self.fans.add_vllm(item[1])
        elif kind == "healthy":
            self.fans.healthy.set(item[1])
        elif kind == "info":
            if "llm" not in self.names:
                return
            self.fans.add_info(item[1])
        elif kind == "rejected":
            self.fans.requests["error"].increment(1)
            self.fans.rejected.get(item[1], self.fans.rejected["internal"]).increment(1)
        elif kind == "flush":
            self._flush_counts()
            item[1].set()

    def _spec_state(self, s: EngineStats) -> None:
        """Speculative-decoding counters: increments since the last state (the engine's are totals)."""
        seen = self._spec_seen
        for fan, now, before in ((self.fans.spec_drafts, s.spec_num_drafts, seen[0]),
                                 (self.fans.spec_draft_tokens, s.spec_num_draft_tokens, seen[1]),
                                 (self.fans.spec_accepted, s.spec_num_accepted_tokens, seen[2])):
            if now > before:
                fan.increment(now - before)
        per_pos = tuple(s.spec_accepted_per_pos)
        self.fans.add_spec_positions(len(per_pos))
        old = seen[3] + (0,) * (len(per_pos) - len(seen[3]))
        for fan, now, before in zip(self.fans.spec_pos, per_pos, old):
            if now > before:
                fan.increment(now - before)
        self._spec_seen = (max(s.spec_num_drafts, seen[0]), max(s.spec_num_draft_tokens, seen[1]),
                           max(s.spec_num_accepted_tokens, seen[2]), tuple(max(a, b) for a, b in zip(per_pos, old)))

    def _lora_state(self, s: EngineStats) -> None:
        """vllm:lora_requests_info: written when its labels change, else at most every
        LORA_INFO_REFRESH_S (vLLM writes it every step)."""
        labels, now = (s.max_loras, tuple(s.lora_running), tuple(s.lora_waiting)), time.monotonic()
        seen = self._lora_seen
        if seen is not None and seen[0] == labels and now - seen[1] < LORA_INFO_REFRESH_S:
            return
        self._lora_seen = (labels, now)
        self.fans.set_lora_info(*labels, time.time())

    def _state(self, s: EngineStats) -> None:
        if s.max_loras and "vllm" in self.names:
            self._lora_state(s)
        self._spec_state(s)
        if s.num_preemptions_total > self._preemptions_seen:
            self.fans.preemptions.increment(s.num_preemptions_total - self._preemptions_seen)
            self._preemptions_seen = s.num_preemptions_total
        self.fans.running.set(s.running)
        self.fans.waiting.set(s.waiting)
        self.fans.kv_used.set(s.kv_used_blocks)
        self.fans.kv_free.set(s.kv_free_blocks)
        self.fans.kv_usage.set(s.kv_usage_ratio)
        self.fans.prefix_hit.set(s.prefix_cache_hit_ratio)
        if self._prefix_counts is not None:
            queried, hit = self._prefix_counts()
            q0, h0 = self._prefix_seen
            if queried > q0:
                self.fans.prefix_queries.increment(queried - q0)
            if hit > h0:
                self.fans.prefix_hits.increment(hit - h0)
            self._prefix_seen = (max(queried, q0), max(hit, h0))

    def _output(self, out: RequestOutput, t: float) -> None:
        r = self._reqs.get(out.request_id)
        if r is None:
            r = self._reqs[out.request_id] = _ReqTimes(out.arrival_time or t)
        n = len(out.token_ids)
        if n and not r.seen_prompt:
            r.seen_prompt = True
            self._count(self.fans.prompt_tokens, out.num_prompt_tokens)
            if out.first_scheduled_time is not None:
                self.fans.queue_time.observe(max(0.0, out.first_scheduled_time - r.arrival))
        if n:
            self._count(self.fans.generation_tokens, n)
            if r.first_token is None:
                r.first_token = t
                self.fans.ttft.observe(t - r.arrival)
                n -= 1  # the first token has no predecessor
            if out.sequence_index == 0:  # n > 1: the inter-token gaps of the first sequence
                if n and r.last_token is not None:
                    gap = (t - r.last_token) / n
                    for _ in range(n):
                        self.fans.itl.observe(gap)
                r.last_token = t
        if out.sequence_finished and out.num_reasoning_tokens:  # once per sequence, its total
            self._count(self.fans.reasoning_tokens, out.num_reasoning_tokens)
        if out.finished:
            # the request's token counts first: a scrape that sees it finished sees all its tokens
            self._flush_counts()
            del self._reqs[out.request_id]
            self.fans.requests.get(out.finish_reason or "error", self.fans.requests["error"]).increment(1)
            if out.rejected:
                self.fans.rejected.get(out.rejected, self.fans.rejected["internal"]).increment(1)
            if out.timed_out:
                self.fans.timed_out.increment(1)
            if out.finish_reason != "error":
                self.fans.e2e.observe(t - r.arrival)
                self.fans.prompt_len.observe(out.num_prompt_tokens)
                self.fans.gen_len.observe(out.num_output_tokens)
                self.fans.params_n.observe(out.num_sequences)
                if out.max_tokens is not None:
                    self.fans.params_max_tokens.observe(out.max_tokens)
