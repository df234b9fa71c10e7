"""The LLM metric families docs/operations/metrics.md documents, and polling helpers over the metrics endpoint."""

from __future__ import annotations

import time

from clients import Metrics, scrape_metrics

LABELS = {"model": "llm", "version": "1"}

COUNTERS = ["llm_prompt_tokens_total", "llm_generation_tokens_total", "llm_requests_total",
            "llm_preemptions_total", "llm_requests_rejected_total", "llm_requests_timed_out_total",
            "llm_reasoning_tokens_total"]
GAUGES = ["llm_num_requests_running", "llm_num_requests_waiting", "llm_kv_cache_used_blocks",
          "llm_kv_cache_free_blocks", "llm_kv_cache_usage_ratio", "llm_prefix_cache_hit_ratio"]
HISTOGRAMS = ["llm_time_to_first_token_seconds", "llm_inter_token_latency_seconds",
              "llm_e2e_request_latency_seconds", "llm_request_queue_time_seconds",
              "llm_request_prompt_tokens", "llm_request_generation_tokens"]

# vLLM's names (issue 19 section 1), with their Prometheus types, as the server must expose them; labels
# model_name (the Triton model) and engine (the instance)
VLLM = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge", "vllm:cache_config_info": "gauge",
        "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter",
        "vllm:request_success_total": "counter", "vllm:num_preemptions_total": "counter",
        "vllm:prefix_cache_queries_total": "counter", "vllm:prefix_cache_hits_total": "counter",
        "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
        "vllm:time_per_output_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram"}
VLLM_LABELS = {"model_name": "llm"}


def vllm_value(m: Metrics, name: str, **labels) -> float:
    return m.value(name, **VLLM_LABELS, **labels)


def missing_vllm_families(m: Metrics) -> list[str]:
    """vLLM-named families absent from the scrape, of another type, or without a model_name="llm" sample."""
    missing = []
    for name, kind in VLLM.items():
        sfx = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        if m.types.get(name) != kind or not all(m.find(name + x, **VLLM_LABELS) for x in sfx):
            missing.append(f"{name} ({kind}; exposed as {m.types.get(name)})")
    return missing


def llm_value(m: Metrics, name: str, **labels) -> float:
    return m.value(name, **LABELS, **labels)


def has_llm_sample(m: Metrics, name: str) -> bool:
    return bool(m.find(name, **LABELS))


def missing_families(m: Metrics) -> list[str]:
    """Documented families absent from the scrape (or without a model="llm", version="1" sample)."""
    missing = []
    for name in COUNTERS + GAUGES:
        if not has_llm_sample(m, name):
            missing.append(name)
    for name in HISTOGRAMS:
        if not all(has_llm_sample(m, name + sfx) for sfx in ("_bucket", "_sum", "_count")):
            missing.append(name)
    return missing


def wait_for(metrics_url: str, predicate, timeout: float, poll: float = 0.05) -> tuple[Metrics, float]:
    """Scrape until predicate(metrics) is true; returns (metrics, seconds waited). Raises
    AssertionError with the last values on timeout."""
    t0 = time.monotonic()
    while True:
        m = scrape_metrics(metrics_url)
        if predicate(m):
            return m, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"metrics condition not met within {timeout} s; llm gauges: "
                                 + ", ".join(f"{g}={llm_value(m, g)}" for g in GAUGES if has_llm_sample(m, g)))
        time.sleep(poll)


def is_idle(m: Metrics) -> bool:
    return (has_llm_sample(m, "llm_kv_cache_used_blocks") and llm_value(m, "llm_kv_cache_used_blocks") == 0
            and llm_value(m, "llm_num_requests_running") == 0 and llm_value(m, "llm_num_requests_waiting") == 0)
