"""LLMMetrics's two name sets against a recording stand-in for pb_utils.MetricFamily: the vllm:
families (vLLM's names, types, labels model_name / engine, histogram buckets), the same values as
the llm_ families for the same events, every metric call on the one metrics thread, and the
config.pbtxt parameter metrics_names that turns either set off."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from paddle_llm_engine.outputs import EngineStats, RequestOutput
from paddle_llm_triton.config_params import serving_options
from paddle_llm_triton.metrics import (NAME_SETS, VLLM_ITL_BUCKETS, VLLM_NAMES, VLLM_REQUEST_LATENCY_BUCKETS,
                                       VLLM_TTFT_BUCKETS, LLMMetrics, build_1_2_5_buckets, parse_name_sets)

LABELS = {"model": "llm", "version": "1", "instance": "llm_0_1"}
VLLM_LABELS = {"model_name": "llm", "engine": "llm_0_1"}


class _Metric:
    calls = 0  # every metric write (each is an IPC round trip in the real stub)

    def __init__(self, family, labels, buckets):
        self.family, self.labels, self.buckets = family, labels, buckets
        self.value, self.observed = 0.0, []
        self.writes = 0

    def _call(self):
        _Family.threads.add(threading.current_thread().name)
        _Metric.calls += 1
        self.writes += 1

    def increment(self, v):
        self._call()
        self.value += v

    def set(self, v):
        self._call()
        self.value = v

    def observe(self, v):
        self._call()
        self.observed.append(v)


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    all: list = []
    threads: set = set()

    def __init__(self, name, description, kind):
        self.name, self.kind, self.metrics = name, kind, []
        _Family.threads.add(threading.current_thread().name)
        _Family.all.append(self)

    def Metric(self, labels, buckets=None):
        m = _Metric(self, labels, buckets)
        self.metrics.append(m)
        return m


def families(prefix: str) -> dict:
    return {f.name: f for f in _Family.all if f.name.startswith(prefix)}


def metric(name: str, **labels) -> _Metric:
    found = [m for f in _Family.all if f.name == name for m in f.metrics
             if all(m.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


@pytest.fixture
def make(monkeypatch):
    _Family.all, _Family.threads = [], set()
    pb = types.ModuleType("triton_python_backend_utils")
    pb.MetricFamily = _Family
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    made = []
    prefix = {"counts": (0, 0)}

    def make(names=NAME_SETS, max_model_len=2048):
        m = LLMMetrics(LABELS, names=names)
        made.append(m)
        m.on_engine_config(max_model_len, 64, 364, True, "float32", prefix_counts=lambda: prefix["counts"])
        m.prefix = prefix
        return m

    yield make
    for m in made:
        m.shutdown()


def _stats(running=0, waiting=0, used=0, free=364, preemptions=0):
    return EngineStats(running=running, waiting=waiting, kv_used_blocks=used, kv_free_blocks=free,
                       prefix_cache_hit_ratio=0.25, num_preemptions_total=preemptions)


def _one_request(m: LLMMetrics, rid="r", reason="length", n_prompt=5, n_out=4):
    """A request's outputs as the engine sends them: arrival 1.0, scheduled 1.5, one token per output."""
    for i in range(n_out):
        last = i == n_out - 1
        m.on_output(RequestOutput(request_id=rid, token_ids=[7], num_prompt_tokens=n_prompt, arrival_time=1.0,
                                  first_scheduled_time=1.5, finished=last, finish_reason=reason if last else None,
                                  num_output_tokens=i + 1))


def test_every_vllm_name_with_vllms_type_labels_and_buckets(make):
    m = make(max_model_len=2048)
    m.flush()
    fams = families("vllm:")
    assert sorted(fams) == sorted(VLLM_NAMES)
    for name, kind in VLLM_NAMES.items():
        assert fams[name].kind == kind, name
        for x in fams[name].metrics:
            assert {k: x.labels[k] for k in VLLM_LABELS} == VLLM_LABELS, (name, x.labels)
            assert "model" not in x.labels and "instance" not in x.labels, (name, x.labels)
    assert metric("vllm:time_to_first_token_seconds").buckets == VLLM_TTFT_BUCKETS
    for name in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"):
        assert metric(name).buckets == VLLM_ITL_BUCKETS
    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"):
        assert metric(name).buckets == VLLM_REQUEST_LATENCY_BUCKETS
    for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert metric(name).buckets == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert {x.labels["finished_reason"] for x in fams["vllm:request_success_total"].metrics} == {
        "stop", "length", "abort", "error"}
    info = metric("vllm:cache_config_info")
    assert info.value == 1
    assert (info.labels["block_size"], info.labels["num_gpu_blocks"], info.labels["enable_prefix_caching"],
            info.labels["cache_dtype"]) == ("64", "364", "True", "float32")
    assert families("llm_")  # both sets by default
    assert _Family.threads == {"llm-metrics"}


def test_1_2_5_buckets():
    assert build_1_2_5_buckets(8192) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    assert build_1_2_5_buckets(1) == [1]


def test_same_values_under_both_names(make):
    m = make()
    m.on_state(_stats(running=1, waiting=2, used=3, free=361, preemptions=2))
    _one_request(m, "a", "length", n_prompt=5, n_out=4)
    _one_request(m, "b", "stop", n_prompt=3, n_out=2)
    m.on_rejected("queue_full")
    m.flush()
    pairs = [("llm_prompt_tokens_total", "vllm:prompt_tokens_total", 8),
             ("llm_generation_tokens_total", "vllm:generation_tokens_total", 6),
             ("llm_preemptions_total", "vllm:num_preemptions_total", 2),
             ("llm_num_requests_running", "vllm:num_requests_running", 1),
             ("llm_num_requests_waiting", "vllm:num_requests_waiting", 2),
             ("llm_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", 3 / 364),
             ("llm_kv_cache_usage_ratio", "vllm:gpu_cache_usage_perc", 3 / 364)]
    for llm_name, vllm_name, want in pairs:
        assert metric(llm_name).value == metric(vllm_name).value == pytest.approx(want), (llm_name, vllm_name)
    for reason, want in (("length", 1), ("stop", 1), ("abort", 0), ("error", 1)):
        assert (metric("llm_requests_total", finish_reason=reason).value
                == metric("vllm:request_success_total", finished_reason=reason).value == want), reason
    hists = [("llm_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
             ("llm_inter_token_latency_seconds", "vllm:inter_token_latency_seconds"),
             ("llm_inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
             ("llm_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"),
             ("llm_request_queue_time_seconds", "vllm:request_queue_time_seconds"),
             ("llm_request_prompt_tokens", "vllm:request_prompt_tokens"),
             ("llm_request_generation_tokens", "vllm:request_generation_tokens")]
    for llm_name, vllm_name in hists:
        assert metric(llm_name).observed == metric(vllm_name).observed, (llm_name, vllm_name)
    assert metric("vllm:request_prompt_tokens").observed == [5, 3]
    assert metric("vllm:request_generation_tokens").observed == [4, 2]
    assert metric("vllm:request_queue_time_seconds").observed == [0.5, 0.5]
    assert len(metric("vllm:inter_token_latency_seconds").observed) == 3 + 1
    assert _Family.threads == {"llm-metrics"}


def test_metric_writes_per_token_stay_bounded_when_outputs_queue_up(make):
    """32 streams x 20 steps queued before the metrics thread runs: the token counters get one write
    per pass, gauges one write per change, and only the inter-token histograms (one observation per
    token, 3 families with both name sets) grow with the tokens. Values are those of one write per
    output: 640 generated tokens, 32 x 19 gaps under each ITL name."""
    m = make()
    m.flush()
    gate = threading.Event()
    m._q.put(("flush", gate))  # processed first; the thread then takes the rest in one pass
    held = threading.Event()
    orig = m._apply

    def slow_first(item):  # hold the thread until everything is queued
        orig(item)
        if item[0] == "flush" and item[1] is gate:
            held.wait(10)
    m._apply = slow_first
    assert gate.wait(10)
    before = _Metric.calls
    for step in range(20):
        for i in range(32):
            m.on_output(RequestOutput(request_id=f"r{i}", token_ids=[7], num_prompt_tokens=5, arrival_time=1.0,
                                      first_scheduled_time=1.5, num_output_tokens=step + 1))
        m.on_state(_stats(running=32, used=40 + step // 10))
    held.set()
    m.flush()
    writes = _Metric.calls - before
    assert metric("llm_generation_tokens_total").value == metric("vllm:generation_tokens_total").value == 640
    assert metric("llm_prompt_tokens_total").value == 32 * 5
    assert metric("llm_generation_tokens_total").writes <= 3 and metric("vllm:generation_tokens_total").writes <= 3
    itl = 32 * 19
    assert len(metric("llm_inter_token_latency_seconds").observed) == itl
    assert len(metric("vllm:time_per_output_token_seconds").observed) == itl
    ttft = 32 * 2  # llm_ and vllm: first-token histograms, one observation per request each
    queue_time = 32 * 2
    # histograms per token + per request, plus a handful of counter and gauge writes
    assert writes <= 3 * itl + ttft + queue_time + 40, writes
    assert metric("llm_num_requests_running").value == 32 and metric("llm_kv_cache_usage_ratio").value == pytest.approx(41 / (41 + 364))


def test_a_gauge_is_written_when_it_changes(make):
    m = make()
    m.flush()
    g = metric("vllm:num_requests_waiting")
    for w in (3, 3, 3, 5, 5, 0):
        m.on_state(_stats(waiting=w))
        m.flush()  # one state per pass: each is applied
    assert g.value == 0 and metric("llm_num_requests_waiting").value == 0
    assert g.writes <= 1 + 3  # the start value, then 3, 5 and 0


def test_prefix_cache_counters_follow_the_engines_counts(make):
    m = make()
    m.flush()
    assert metric("vllm:prefix_cache_queries_total").value == metric("vllm:prefix_cache_hits_total").value == 0
    m.prefix["counts"] = (128, 64)
    m.on_state(_stats())
    m.prefix["counts"] = (200, 64)
    m.on_state(_stats())
    m.on_state(_stats())  # unchanged: nothing added
    m.flush()
    assert metric("vllm:prefix_cache_queries_total").value == 200
    assert metric("vllm:prefix_cache_hits_total").value == 64


@pytest.mark.parametrize("names,present,absent", [(("vllm",), "vllm:", "llm_"), (("llm",), "llm_", "vllm:")])
def test_one_set_only(make, names, present, absent):
    m = make(names=names)
    m.on_engine_info({"device": "cpu"})
    m.on_state(_stats(running=1))
    _one_request(m)
    m.on_rejected("invalid")
    m.on_engine_failed()
    m.flush()
    assert families(present) and not families(absent), sorted(f.name for f in _Family.all)
    if present == "vllm:":
        assert metric("vllm:request_success_total", finished_reason="length").value == 1
        assert metric("vllm:request_success_total", finished_reason="error").value == 1
    else:
        assert metric("llm_requests_total", finish_reason="length").value == 1


def _cfg(params: dict) -> dict:
    return {"name": "llm", "parameters": {k: {"string_value": v} for k, v in params.items()}}


@pytest.mark.parametrize("value,want", [("", ("llm", "vllm")), ("llm,vllm", ("llm", "vllm")),
                                        ("vllm, llm", ("llm", "vllm")), ("vllm", ("vllm",)), ("LLM", ("llm",)),
                                        ("llm;vllm", ("llm", "vllm"))])
def test_metrics_names_parameter(value, want):
    assert serving_options(_cfg({"metrics_names": value})).metrics_names == want
    assert serving_options(_cfg({})).metrics_names == ("llm", "vllm")


@pytest.mark.parametrize("value", ["prometheus", "llm,vllm,sglang", " , ", "vllm:"])
def test_metrics_names_parameter_rejects_unknown_sets(value):
    with pytest.raises(ValueError, match=r"metrics_names must list one or both of llm, vllm .*got"):
        serving_options(_cfg({"metrics_names": value}))
    if value.strip(" ,"):
        with pytest.raises(ValueError):
            parse_name_sets(value)


def test_shipped_config_sets_both():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "model_repository" / "llm" / "config.pbtxt").read_text()
    m = re.search(r'key: "metrics_names" value: \{ string_value: "([^"]*)" \}', text)
    assert m and parse_name_sets(m.group(1)) == ("llm", "vllm")


def test_spec_decode_counters_under_both_names(make):
    """The engine's speculative-decoding totals become counter increments under the llm_ and vllm:
    names, per draft position with label `position`."""
    m = make()
    m.on_state(_stats())
    m.on_state(EngineStats(running=1, waiting=0, kv_used_blocks=1, kv_free_blocks=363, prefix_cache_hit_ratio=0.0,
                           num_preemptions_total=0, spec_num_drafts=3, spec_num_draft_tokens=10,
                           spec_num_accepted_tokens=6, spec_accepted_per_pos=(3, 2, 1, 0)))
    m.flush()
    m.on_state(EngineStats(running=1, waiting=0, kv_used_blocks=1, kv_free_blocks=363, prefix_cache_hit_ratio=0.0,
                           num_preemptions_total=0, spec_num_drafts=5, spec_num_draft_tokens=18,
                           spec_num_accepted_tokens=9, spec_accepted_per_pos=(5, 3, 1, 0)))
    m.flush()
    for llm_name, vllm_name, want in [
            ("llm_spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts_total", 5),
            ("llm_spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total", 18),
            ("llm_spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_total", 9)]:
        assert metric(llm_name).value == metric(vllm_name).value == want, llm_name
    for pos, want in enumerate((5, 3, 1, 0)):
        assert metric("llm_spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)).value == want
        v = metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos))
        assert v.value == want and v.labels["model_name"] == "llm"


def _lora_stats(running=(), waiting=(), max_loras=2):
    return EngineStats(running=len(running), waiting=len(waiting), kv_used_blocks=0, kv_free_blocks=364,
                       prefix_cache_hit_ratio=0.0, num_preemptions_total=0, max_loras=max_loras,
                       lora_running=tuple(running), lora_waiting=tuple(waiting))


def test_lora_requests_info_has_vllms_labels_the_time_as_value_and_one_series(make):
    """vllm:lora_requests_info (LoRA on): labels running_lora_adapters / waiting_lora_adapters (names
    joined by ",") and max_lora, value the wall-clock time of the update; the same labels again within
    a second are not written again; new labels replace the series."""
    import time

    m = make()
    t0 = time.time()
    m.on_state(_lora_stats(running=("sql",)))
    m.flush()
    fam = families("vllm:lora_requests_info")["vllm:lora_requests_info"]
    assert fam.kind == "gauge" and len(fam.metrics) == 1
    first = fam.metrics[0]
    assert first.labels == {**VLLM_LABELS, "max_lora": "2", "running_lora_adapters": "sql", "waiting_lora_adapters": ""}
    assert t0 <= first.value <= time.time()
    writes = first.writes
    m.on_state(_lora_stats(running=("sql",)))
    m.flush()
    assert first.writes == writes, "unchanged labels within LORA_INFO_REFRESH_S are not written again"
    m.on_state(_lora_stats(running=("chat", "sql"), waiting=("fin",)))
    m.flush()
    latest = fam.metrics[-1]
    assert latest.labels["running_lora_adapters"] == "chat,sql" and latest.labels["waiting_lora_adapters"] == "fin"
    assert m.fans._lora_metric is latest and first.writes == writes and latest.value >= first.value
    assert _Family.threads == {"llm-metrics"}


@pytest.mark.parametrize("names, max_loras", [(("llm", "vllm"), 0), (("llm",), 2)])
def test_no_lora_gauge_without_lora_or_without_vllms_names(make, names, max_loras):
    m = make(names=names)
    m.on_state(_lora_stats(max_loras=max_loras))
    m.flush()
    assert "vllm:lora_requests_info" not in families("vllm:")
