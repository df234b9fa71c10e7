"""adaptive_kernel_threads in the engine: the worker puts a KernelThreadTuner on the decode stack when
the C++ kernels run on 2 or more threads, the tuner sees every decode step, and greedy output is the
same as with a fixed thread count."""

from __future__ import annotations

import pytest

from paddle_llm_engine.config import EngineConfig, ModelConfig
from test_engine_tiny import greedy, make_engine, prompt, run


def test_tuner_attached_and_outputs_unchanged(tiny_model_dir):
    reqs = {f"r{i}": (prompt(6 + i, salt=i), greedy(12)) for i in range(3)}
    fixed = make_engine(tiny_model_dir)  # default 0, num_threads 2
    assert fixed.executor.worker.thread_tuner is None
    want = run(fixed, reqs)
    fixed.close()
    tuned = make_engine(tiny_model_dir, adaptive_kernel_threads=1)
    tuner = tuned.executor.worker.thread_tuner
    assert tuner is not None and tuner.threads == 2
    assert tuned.executor.worker.model.decode_stack.tuner is tuner
    got = run(tuned, reqs)
    tuned.close()
    assert {r: v["tokens"] for r, v in got.items()} == {r: v["tokens"] for r, v in want.items()}
    snap = tuner.snapshot()
    # three sequences decode together, then fewer as they finish: every decode step went through it
    assert snap and sum(b["calls"] for b in snap.values()) >= 11
    assert all(set(b["ms"]) <= {1, 2} and all(ms > 0 for ms in b["ms"].values()) for b in snap.values())


def test_no_tuner_on_one_thread(tiny_model_dir):
    engine = make_engine(tiny_model_dir, num_threads=1, adaptive_kernel_threads=1)
    assert engine.executor.worker.thread_tuner is None
    engine.close()


def test_setting_checked(tiny_model_dir):
    with pytest.raises(ValueError, match="adaptive_kernel_threads"):
        EngineConfig(model_dir=tiny_model_dir, adaptive_kernel_threads=2).validate(ModelConfig.from_dir(tiny_model_dir))
