"""LLMMetrics for the admission limit and deadlines, against a recording stand-in for
pb_utils.MetricFamily: llm_requests_rejected_total{reason} (every reason registered at 0), the
llm_requests_total{finish_reason="error"} count kept for refusals, llm_requests_timed_out_total,
llm_engine_info's admission labels, and every metric call made on the one metrics thread."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from paddle_llm_engine.outputs import RequestOutput
from paddle_llm_triton.metrics import REJECT_REASONS, LLMMetrics

LABELS = {"model": "llm", "version": "1", "instance": "llm_0_0"}


class _Metric:
    def __init__(self, family, labels):
        self.family, self.labels, self.value = family, labels, 0.0
        self.threads = family.threads

    def _call(self):
        self.threads.add(threading.current_thread().name)

    def increment(self, v):
        self._call()
        self.value += v

    def set(self, v):
        self._call()
        self.value = v

    def observe(self, v):
        self._call()


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    all: list = []
    threads: set = set()

    def __init__(self, name, description, kind):
        self.name, self.kind, self.metrics = name, kind, []
        _Family.threads.add(threading.current_thread().name)
        _Family.all.append(self)

    def Metric(self, labels, buckets=None):
        m = _Metric(self, labels)
        self.metrics.append(m)
        return m


def value(name: str, **labels) -> float:
    found = [m.value for f in _Family.all if f.name == name for m in f.metrics
             if all(m.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


@pytest.fixture
def metrics(monkeypatch):
    _Family.all, _Family.threads = [], set()
    pb = types.ModuleType("triton_python_backend_utils")
    pb.MetricFamily = _Family
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    m = LLMMetrics(LABELS)
    yield m
    m.shutdown()


def test_rejections_count_by_reason_and_as_errors(metrics):
    metrics.flush()
    for r in REJECT_REASONS:  # registered at 0, so rates exist before the first refusal
        assert value("llm_requests_rejected_total", reason=r, **LABELS) == 0
    assert set(REJECT_REASONS) >= {"queue_full", "invalid", "not_serving", "draining"}
    metrics.on_rejected("queue_full")
    metrics.on_rejected("queue_full")
    metrics.on_rejected("invalid")
    metrics.on_rejected("not_serving")
    # refused by the engine thread: arrives as an output
    metrics.on_output(RequestOutput(request_id="x", finished=True, finish_reason="error", error="text_input: ...",
                                    rejected="invalid"))
    metrics.flush()
    assert value("llm_requests_rejected_total", reason="queue_full") == 2
    assert value("llm_requests_rejected_total", reason="invalid") == 2
    assert value("llm_requests_rejected_total", reason="not_serving") == 1
    assert value("llm_requests_rejected_total", reason="draining") == 0
    assert value("llm_requests_total", finish_reason="error") == 5
    assert _Family.threads == {"llm-metrics"}


def test_timed_out_request_counts_as_abort_and_timed_out(metrics):
    metrics.on_output(RequestOutput(request_id="t", token_ids=[5], num_prompt_tokens=3, arrival_time=1.0))
    metrics.on_output(RequestOutput(request_id="t", finished=True, finish_reason="abort", timed_out=True,
                                    error="deadline exceeded: ...", error_code="unavailable", arrival_time=1.0))
    metrics.on_output(RequestOutput(request_id="c", finished=True, finish_reason="abort", arrival_time=1.0))
    metrics.flush()
    assert value("llm_requests_timed_out_total", **LABELS) == 1
    assert value("llm_requests_total", finish_reason="abort") == 2
    assert value("llm_requests_total", finish_reason="error") == 0
    assert value("llm_requests_rejected_total", reason="queue_full") == 0


def test_engine_info_carries_the_admission_limits(metrics):
    metrics.on_engine_info({"device": "cpu", "max_num_seqs": "32", "max_num_waiting": "128"})
    metrics.flush()
    (fam,) = [f for f in _Family.all if f.name == "llm_engine_info"]
    (m,) = fam.metrics
    assert m.value == 1 and m.labels == {**LABELS, "device": "cpu", "max_num_seqs": "32", "max_num_waiting": "128"}
