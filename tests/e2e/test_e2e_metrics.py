"""The LLM metrics docs/operations/metrics.md documents, on Triton's metrics endpoint, with model / version
labels and values consistent with the requests sent."""

from __future__ import annotations

import pytest

from clients import decode_str, ensemble_stream, llm_stream, scrape_metrics
from metrics_util import (COUNTERS, GAUGES, HISTOGRAMS, VLLM, has_llm_sample, is_idle, llm_value,
                          missing_families, missing_vllm_families, vllm_value, wait_for)

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time"
FLAGS = dict(return_finish_reason=True, return_num_input_tokens=True, return_num_output_tokens=True)


def _snapshot(m):
    snap = {name: llm_value(m, name) for name in COUNTERS}
    for reason in ("stop", "length", "abort"):
        snap[f"requests_{reason}"] = llm_value(m, "llm_requests_total", finish_reason=reason)
    for h in HISTOGRAMS:
        snap[h + "_count"] = llm_value(m, h + "_count")
        snap[h + "_sum"] = llm_value(m, h + "_sum")
    for name, kind in VLLM.items():  # the same values under vLLM's names
        if kind == "histogram":
            snap[name + "_count"] = vllm_value(m, name + "_count")
            snap[name + "_sum"] = vllm_value(m, name + "_sum")
        elif kind == "counter":
            snap[name] = vllm_value(m, name)
    for reason in ("stop", "length", "abort"):
        snap[f"vllm_success_{reason}"] = vllm_value(m, "vllm:request_success_total", finished_reason=reason)
    return snap


def test_documented_families_present_with_labels(triton_server):
    llm_stream(triton_server.grpc_url, PROMPT, stream=True,
               sampling_parameters={"temperature": "0", "max_tokens": "4"}).raise_for_error()
    m = scrape_metrics(triton_server.metrics_url)
    missing = missing_families(m)
    assert not missing, f"LLM metric families missing from {triton_server.metrics_url}: {missing}"
    for name in COUNTERS:
        assert m.types.get(name) == "counter", (name, m.types.get(name))
    for name in GAUGES:
        assert m.types.get(name) == "gauge", (name, m.types.get(name))
    for name in HISTOGRAMS:
        assert m.types.get(name) == "histogram", (name, m.types.get(name))
    assert m.find("llm_requests_total", model="llm", version="1", finish_reason="length")
    # vLLM's names, exactly (counters end in _total as registered: Triton 2.51 appends nothing)
    missing = missing_vllm_families(m)
    assert not missing, f"vLLM-named families missing from {triton_server.metrics_url}: {missing}"
    assert m.find("vllm:request_success_total", model_name="llm", engine="llm_0_0", finished_reason="length")
    info = m.find("vllm:cache_config_info", model_name="llm")
    assert len(info) == 1 and info[0][1] == 1 and info[0][0]["block_size"] == "64", info


def test_values_consistent_with_one_request(triton_server):
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    before_m, _ = wait_for(murl, is_idle, timeout=30)
    before = _snapshot(before_m)
    free_idle = llm_value(before_m, "llm_kv_cache_free_blocks")
    assert free_idle > 0

    r = llm_stream(url, PROMPT, stream=False, exclude_input_in_output=True,
                   sampling_parameters={"temperature": "0", "max_tokens": "8", "ignore_eos": "true"},
                   **FLAGS).raise_for_error()
    assert decode_str(r.responses[-1], "finish_reason") == "length"
    n_in = int(r.last("num_input_tokens").reshape(-1)[0])
    n_out = int(r.last("num_output_tokens").reshape(-1)[0])
    assert n_out == 8

    after_m, _ = wait_for(murl, lambda m: _snapshot(m)["requests_length"] >= before["requests_length"] + 1
                          and _snapshot(m)["vllm_success_length"] >= before["vllm_success_length"] + 1
                          and is_idle(m), timeout=10)
    after = _snapshot(after_m)
    d = {k: after[k] - before[k] for k in after}
    _check_vllm_deltas(d, after_m, n_in, n_out)
    assert d["llm_prompt_tokens_total"] == n_in, d
    assert d["llm_generation_tokens_total"] == n_out, d
    assert d["requests_length"] == 1 and d["requests_stop"] == 0, d
    assert d["llm_requests_total"] == 1, d
    assert d["llm_preemptions_total"] == 0, d
    assert d["llm_requests_rejected_total"] == 0 and d["llm_requests_timed_out_total"] == 0, d
    for h in ("llm_time_to_first_token_seconds", "llm_e2e_request_latency_seconds",
              "llm_request_queue_time_seconds", "llm_request_prompt_tokens", "llm_request_generation_tokens"):
        assert d[h + "_count"] == 1, (h, d)
    assert d["llm_request_prompt_tokens_sum"] == n_in, d
    assert d["llm_request_generation_tokens_sum"] == n_out, d
    assert d["llm_inter_token_latency_seconds_count"] >= 1, d
    assert 0 < d["llm_time_to_first_token_seconds_sum"] <= d["llm_e2e_request_latency_seconds_sum"], d
    assert d["llm_e2e_request_latency_seconds_sum"] < 60, d
    # gauges back at idle: nothing running, nothing held
    assert llm_value(after_m, "llm_num_requests_running") == 0
    assert llm_value(after_m, "llm_kv_cache_used_blocks") == 0
    assert llm_value(after_m, "llm_kv_cache_usage_ratio") == 0
    assert llm_value(after_m, "llm_kv_cache_free_blocks") == free_idle
    assert 0.0 <= llm_value(after_m, "llm_prefix_cache_hit_ratio") <= 1.0


def _check_vllm_deltas(d: dict, after_m, n_in: int, n_out: int):
    """One request with finish reason length, under vLLM's names: the llm_ values, the same."""
    assert d["vllm:prompt_tokens_total"] == n_in, d
    assert d["vllm:generation_tokens_total"] == n_out, d
    assert d["vllm:request_success_total"] == 1 and d["vllm_success_length"] == 1, d
    assert d["vllm_success_stop"] == 0 and d["vllm_success_abort"] == 0, d
    assert d["vllm:num_preemptions_total"] == 0, d
    assert d["vllm:prefix_cache_queries_total"] == n_in, d  # the prompt, looked up once
    assert 0 <= d["vllm:prefix_cache_hits_total"] <= n_in, d
    for h in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert d[h + "_count"] == 1, (h, d)
    assert d["vllm:request_prompt_tokens_sum"] == n_in and d["vllm:request_generation_tokens_sum"] == n_out, d
    for h in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"):
        assert d[h + "_count"] == d["llm_inter_token_latency_seconds_count"] >= 1, (h, d)
    for a, b in (("vllm:time_to_first_token_seconds", "llm_time_to_first_token_seconds"),
                 ("vllm:e2e_request_latency_seconds", "llm_e2e_request_latency_seconds"),
                 ("vllm:request_queue_time_seconds", "llm_request_queue_time_seconds")):
        assert d[a + "_sum"] == pytest.approx(d[b + "_sum"], rel=1e-6, abs=1e-9), (a, d)
    for g in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:gpu_cache_usage_perc"):
        assert vllm_value(after_m, g) == 0, g


def test_stop_finish_reason_counted(triton_server):
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    before_m, _ = wait_for(murl, is_idle, timeout=30)
    before = _snapshot(before_m)
    r = llm_stream(url, "1, 2, 3, 4,", stream=True,
                   sampling_parameters={"temperature": "0", "max_tokens": "16", "stop": ["7"]},
                   **FLAGS).raise_for_error()
    assert decode_str(r.responses[-1], "finish_reason") == "stop"
    n_out = sum(int(a.reshape(-1)[0]) for a in r.all("num_output_tokens"))
    after_m, _ = wait_for(murl, lambda m: _snapshot(m)["requests_stop"] >= before["requests_stop"] + 1
                          and is_idle(m), timeout=10)
    after = _snapshot(after_m)
    assert after["requests_stop"] - before["requests_stop"] == 1
    assert after["requests_length"] == before["requests_length"]
    assert after["llm_generation_tokens_total"] - before["llm_generation_tokens_total"] == n_out


def test_running_gauge_and_used_blocks_during_generation(triton_server):
    """While a request generates, running is 1 and it holds KV blocks."""
    from clients import GrpcStream, llm_inputs

    url, murl = triton_server.grpc_url, triton_server.metrics_url
    wait_for(murl, is_idle, timeout=30)
    s = GrpcStream(url, "llm", llm_inputs(PROMPT, True, {"temperature": "0", "max_tokens": "96",
                                                         "ignore_eos": "true"}))
    try:
        result, err = s.next()
        assert err is None, err
        m, _ = wait_for(murl, lambda m: llm_value(m, "llm_num_requests_running") == 1
                        and llm_value(m, "llm_kv_cache_used_blocks") >= 1, timeout=5)
        used, free = llm_value(m, "llm_kv_cache_used_blocks"), llm_value(m, "llm_kv_cache_free_blocks")
        assert llm_value(m, "llm_kv_cache_usage_ratio") == pytest.approx(used / (used + free), rel=1e-3)
    finally:
        rest = s.collect()
    rest.raise_for_error()
    wait_for(murl, is_idle, timeout=10)
    assert has_llm_sample(scrape_metrics(murl), "llm_kv_cache_used_blocks")


def test_engine_info_names_what_the_instance_runs_on(triton_server):
    """llm_engine_info = 1 with the instance's device and the platform layer's choices as labels,
    equal to what an engine built here with the same settings decides."""
    from paddle_llm_engine.platforms import plan_for_device

    m = scrape_metrics(triton_server.metrics_url)
    info = m.find("llm_engine_info", model="llm", version="1", instance="llm_0_0")
    assert len(info) == 1 and info[0][1] == 1, info
    labels = info[0][0]
    plan = plan_for_device("cpu")
    want_kernels = ";".join(k for k, on in plan.kernels.items() if on).replace(
        "cpu_kernels", f"cpu_kernels_{plan.cpu_isa}") or "composed"
    assert labels["device"] == "cpu" and labels["dtype"] == "float32"
    assert labels["kv_cache_dtype"] == plan.kv_cache_dtype == "float32"
    assert labels["kernels"] == want_kernels and labels["quantization"] == "none"
    assert labels["tensor_parallel_size"] == "1"
    assert (labels["max_num_seqs"], labels["max_num_waiting"]) == ("32", "128")  # the default: 4 x max_num_seqs
    log = triton_server.log_path.read_text(errors="replace")
    assert (f"llm instance llm_0_0: serving on cpu (dtype float32, kv_cache_dtype {plan.kv_cache_dtype}, kernels "
            f"{want_kernels}") in log


def test_bad_input_counts_as_error_and_as_rejected_invalid(triton_server):
    """A refused request counts once in llm_requests_total{finish_reason="error"} (as before) and once
    in llm_requests_rejected_total{reason="invalid"}, whether execute() or the engine thread refused it."""
    url, murl = triton_server.grpc_url, triton_server.metrics_url
    m0, _ = wait_for(murl, is_idle, timeout=30)
    for reason in ("queue_full", "invalid", "not_serving", "draining"):
        assert m0.find("llm_requests_rejected_total", model="llm", version="1", reason=reason), reason
    err0 = llm_value(m0, "llm_requests_total", finish_reason="error")
    inv0 = llm_value(m0, "llm_requests_rejected_total", reason="invalid")
    bad = llm_stream(url, PROMPT, stream=True, sampling_parameters={"top_p": "2"})  # refused in execute()
    assert bad.error is not None and "sampling_parameters.top_p" in str(bad.error)
    # the ensemble's llm step: preprocessing does not count tokens against max_model_len, the engine does
    long = ensemble_stream(url, "hello" + " hello" * 9000, stream=True, max_tokens=4)
    assert long.error is not None and "text_input: the prompt has" in str(long.error), long.error
    m, _ = wait_for(murl, lambda m: llm_value(m, "llm_requests_rejected_total", reason="invalid") >= inv0 + 2,
                    timeout=10)
    assert llm_value(m, "llm_requests_rejected_total", reason="invalid") == inv0 + 2
    assert llm_value(m, "llm_requests_total", finish_reason="error") == err0 + 2
    assert llm_value(m, "llm_requests_rejected_total", reason="queue_full") == 0
