"""Features of newer Triton versions, against the stand-in pb_utils (pb_standin.py): the llm model's
is_ready() (Triton >= 2.67 calls it on /v2/models/llm/ready) follows the engine's health, and the
model files still import and run on the 2.51 feature set. (The ensemble pipeline's response
parameters are in test_ensemble_pipeline.py.)"""

from __future__ import annotations

import importlib.util
import sys
import time
import types
from pathlib import Path

import pytest

import pb_standin
from paddle_llm_engine.engine_loop import EngineLoop
from paddle_llm_engine.outputs import EngineStats
from paddle_llm_engine.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[2]


def load_model(monkeypatch, name: str, newer: bool):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_standin.make(newer))
    spec = importlib.util.spec_from_file_location(f"model_{name}_{newer}", REPO / "model_repository" / name / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel


class FailingEngine:
    """The LLMEngine surface EngineLoop uses; its first step raises."""

    def __init__(self):
        self.requests = {}

    config = types.SimpleNamespace(max_num_waiting=128)
    num_waiting = 0
    num_free_seq_slots = 0

    def check_request(self, ids, params):
        return ids

    def add_prepared(self, rid, prepared, arrival_time=None, timeout_s=None):
        self.requests[rid] = 1

    def abort_request(self, rid):
        return None

    def has_unfinished_requests(self):
        return bool(self.requests)

    def step(self):
        raise RuntimeError("device lost")

    def stats(self):
        return EngineStats(running=0, waiting=0, kv_used_blocks=0, kv_free_blocks=1, prefix_cache_hit_ratio=0.0,
                           num_preemptions_total=0)


@pytest.mark.parametrize("newer", [False, True])
def test_llm_is_ready_follows_the_engine_health(monkeypatch, newer):
    model = load_model(monkeypatch, "llm", newer)()
    from paddle_llm_triton.llm.instance import LLMInstance

    assert model.is_ready() is False  # not initialized: no engine
    model.llm = LLMInstance.__new__(LLMInstance)  # only its engine loop: what readiness reads
    loop = model.llm.loop = EngineLoop(FailingEngine())
    try:
        assert model.is_ready() is True
        loop.submit("r", [1, 2], SamplingParams(), lambda out: None)
        t0 = time.monotonic()
        while loop.healthy and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert model.is_ready() is False
    finally:
        loop.shutdown(1)


@pytest.mark.parametrize("newer", [False, True])
def test_ensemble_model_loads_on_both_feature_sets(monkeypatch, newer):
    import json

    cls = load_model(monkeypatch, "ensemble", newer)
    cfg = {"model_transaction_policy": {"decoupled": True}, "parameters": {}}
    pb = sys.modules["triton_python_backend_utils"]
    pb.using_decoupled_model_transaction_policy = lambda c: True
    m = cls()
    m.initialize({"model_config": json.dumps(cfg), "model_name": "ensemble", "model_instance_name": "ensemble_0_0"})
    m.finalize()
