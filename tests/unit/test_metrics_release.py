"""LLMMetrics.shutdown() releases every pb_utils MetricFamily (and with it every Metric) it made, on
the metrics thread: none is left for interpreter teardown, where the stub's own destructor would run
their clean-up (each takes its series off the server) against a stub being destroyed: a segmentation
fault at every unload of `llm`. Recorded with a stand-in for pb_utils.MetricFamily whose objects log
their deletion and that, as the real one, keeps every Metric it made alive until it goes itself."""

from __future__ import annotations

import sys
import threading
import types
import weakref

from paddle_llm_engine.outputs import EngineStats, RequestOutput
from paddle_llm_triton.metrics import LLMMetrics

DELETED: list[tuple[str, str]] = []  # (what, thread)


class _Metric:

    def increment(self, v):
        pass

    def set(self, v):
        pass

    def observe(self, v):
        pass

    def __del__(self):
        DELETED.append(("metric", threading.current_thread().name))


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: list = []

    def __init__(self, name, description, kind):
        self.name, self.metrics = name, []  # the real family's metric map holds each Metric
        _Family.made.append(weakref.ref(self))

    def Metric(self, labels, buckets=None):
        m = _Metric()
        self.metrics.append(m)
        _Metric.made.append(weakref.ref(m))
        return m

    def __del__(self):
        DELETED.append(("family", threading.current_thread().name))


_Metric.made = []


def test_shutdown_releases_every_metric_family_and_metric_on_the_metrics_thread(monkeypatch):
    pb = types.ModuleType("triton_python_backend_utils")
    pb.MetricFamily = _Family
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    DELETED.clear()
    _Family.made.clear()
    _Metric.made.clear()
    m = LLMMetrics({"model": "llm", "version": "1", "instance": "llm_0_0"})
    # every kind of metric the instance makes: both name sets, the info gauge, per-position counters
    m.on_engine_config(2048, 64, 100, True)
    m.on_engine_info({"device": "cpu", "dtype": "float32"})
    m.on_state(EngineStats(running=1, waiting=0, kv_used_blocks=3, kv_free_blocks=97, prefix_cache_hit_ratio=0.0,
                           num_preemptions_total=0, spec_num_drafts=2, spec_num_draft_tokens=8, spec_num_accepted_tokens=5,
                           spec_accepted_per_pos=(2, 2, 1, 0)))
    m.on_output(RequestOutput(request_id="r", token_ids=[1, 2], text="ab", finished=True, finish_reason="length",
                              num_prompt_tokens=3, num_output_tokens=2))
    m.flush()
    assert len(_Metric.made) > 40 and len(_Family.made) > 20  # the test sees the real set, not a few
    m.shutdown()
    alive = [r for r in _Metric.made + _Family.made if r() is not None]
    assert not alive, f"{len(alive)} metric objects outlive shutdown()"
    assert len(DELETED) == len(_Metric.made) + len(_Family.made)
    assert {t for _, t in DELETED} == {"llm-metrics"}
