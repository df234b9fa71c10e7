"""The metric names, label values and histogram buckets of both name sets, and the parsing of the
config.pbtxt parameter metrics_names that chooses between them (config_params.py reads it).

Only constants and pure functions: config_params imports them without starting anything.
"""

from __future__ import annotations

FINISH_REASONS = ("stop", "length", "abort", "error")
# llm_requests_rejected_total{reason}: queue_full (max_num_waiting reached), invalid (bad input),
# not_serving (the engine failed earlier), draining (the server is shutting down), internal (an
# unexpected error while reading the request); all registered at 0 so that rates exist from the start
REJECT_REASONS = ("queue_full", "invalid", "not_serving", "draining", "internal")
LLM_LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
LLM_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]

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
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    # speculative decoding (vLLM's spec-decode counters; 0 while speculative_method is "none")
    "vllm:spec_decode_num_drafts_total": "counter",
    "vllm:spec_decode_num_draft_tokens_total": "counter",
    "vllm:spec_decode_num_accepted_tokens_total": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": "counter",
}
# vLLM's LoRA gauge, made only when the engine serves LoRA adapters (enable_lora 1): its labels are
# the adapters of running and waiting requests and max_lora, its value the time of the last update
LORA_INFO_NAME = "vllm:lora_requests_info"
# how often the gauge's time is refreshed while its labels stay the same (vLLM: every engine step;
# each write is an IPC round trip from the stub to the server)
LORA_INFO_REFRESH_S = 1.0


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
