"""Tensor parallel: start-up refusals (each names both numbers), the shard plan, the device mapping
of instances, and worker failures (a worker that fails to start, a worker killed mid-generation):
the engine names the rank, the requests in flight get an error, and no worker process is left.
Every wait here is bounded (the runner's own timeouts are lowered for the module)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from paddle_llm_engine import EngineConfig, EngineLoop, LLMEngine, SamplingParams
from paddle_llm_engine.errors import EngineDeadError
from paddle_llm_engine.executor import tensor_parallel as tp_runner
from paddle_llm_engine.platforms import Device, GcuPlatform, platform_for
from paddle_llm_engine.tp.shard import ShardPlan
from paddle_llm_triton.config_params import engine_config_from_triton

import tiny_checkpoints as tc


@pytest.fixture(autouse=True)
def _bounded_waits(monkeypatch):
    monkeypatch.setattr(tp_runner, "START_TIMEOUT_S", 240.0)
    monkeypatch.setattr(tp_runner, "STEP_TIMEOUT_S", 120.0)


def tp_workers() -> list[int]:
    """Pids of live tensor-parallel worker processes started by this process."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[1]) == me and b"paddle_llm_engine.executor.tp_worker" in cmd:
            found.append(int(entry))
    return found


def wait_no_workers(timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := tp_workers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def config_only(tmp_path: Path, heads: int, kv_heads: int) -> Path:
    """A model folder with only config.json: the TP checks run before any weight or tokenizer is read."""
    cfg = tc.config_json("llama_tied")
    cfg.update(num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16, hidden_size=16 * heads)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def engine_config(model_dir, tp: int, **kw) -> EngineConfig:
    return EngineConfig(model_dir=str(model_dir), device="cpu", block_size=16, num_kv_blocks=64, max_model_len=128,
                        num_threads=1, tensor_parallel_size=tp, max_num_seqs=4, **kw)


# -- refusals ------------------------------------------------------------------------------------
def test_refuses_tp_not_dividing_heads(tmp_path):
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 does not divide the model's 4 attention heads"):
        LLMEngine(engine_config(config_only(tmp_path, 4, 2), 3))
    assert tp_workers() == []


def test_refuses_tp_incompatible_with_kv_heads(tmp_path):
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 and the model's 4 KV heads"):
        LLMEngine(engine_config(config_only(tmp_path, 12, 4), 3))


def test_refuses_tp_above_cpu_cores(tmp_path):
    n = 2 * (os.cpu_count() or 1)
    with pytest.raises(ValueError, match=rf"tensor_parallel_size {n} exceeds the {os.cpu_count()} CPU cores"):
        LLMEngine(engine_config(config_only(tmp_path, n, n), n))
    assert tp_workers() == []


def test_refuses_tp_below_one(tmp_path):
    with pytest.raises(ValueError, match=r"tensor_parallel_size must be >= 1, got 0"):
        LLMEngine(engine_config(config_only(tmp_path, 4, 2), 0))


def test_refuses_tp_above_gcu_devices(monkeypatch):
    monkeypatch.setattr(GcuPlatform, "device_count", lambda self, device: (2, "gcu devices the plug-in reports"))
    gcu = platform_for("gcu:0")
    assert gcu.rank_devices(2, Device.parse("gcu:0")) == ["gcu:0", "gcu:1"]
    with pytest.raises(ValueError, match=r"tensor_parallel_size 2 on gcu:1..gcu:2 exceeds the 2 gcu devices"):
        gcu.rank_devices(2, Device.parse("gcu:1"))


# -- plan and mapping ----------------------------------------------------------------------------
def test_shard_plan_splits_or_replicates_kv_heads():
    split = [ShardPlan.make(r, 2, 8, 4, 16, 10) for r in range(2)]
    assert [(p.q_start, p.num_heads, p.kv_start, p.num_kv_heads) for p in split] == [(0, 4, 0, 2), (4, 4, 2, 2)]
    assert [(p.vocab_start, p.vocab_end) for p in split] == [(0, 5), (5, 10)]
    repl = [ShardPlan.make(r, 4, 8, 2, 16, 10) for r in range(4)]
    assert [(p.q_start, p.kv_start, p.num_kv_heads) for p in repl] == [(0, 0, 1), (2, 0, 1), (4, 1, 1), (6, 1, 1)]
    assert [(p.vocab_start, p.vocab_end) for p in repl] == [(0, 3), (3, 6), (6, 9), (9, 10)]


def test_instance_k_maps_onto_devices_k_times_n():
    def cfg(tp):
        return {"parameters": {"model_dir": {"string_value": "/m"}, "tensor_parallel_size": {"string_value": str(tp)}},
                "instance_group": [{"count": 3, "kind": "KIND_CPU"}]}

    args = {"model_name": "llm", "model_instance_name": "llm_0_2"}
    assert engine_config_from_triton(cfg(2), args).device_id == 4   # gcu:4, gcu:5
    assert engine_config_from_triton(cfg(1), args).device_id == 2
    assert engine_config_from_triton(cfg(2), args).tensor_parallel_size == 2


# -- what the ranks run ---------------------------------------------------------------------------
@pytest.mark.slow
def test_tp2_engine_info_reports_what_the_ranks_decided(tmp_path):
    """llm_engine_info's labels (LLMEngine.info()) of a TP=2 engine are its ranks' platform plan:
    dtype, KV-cache dtype, kernels and quantization as a TP=1 engine on this host decides them,
    never the "auto" settings."""
    from paddle_llm_engine.platforms import plan_for_device

    model_dir = tc.make_checkpoint("llama_tied", tmp_path / "ck")
    want = plan_for_device("cpu", quantization="wint8")
    kernels = ";".join(k for k, on in want.kernels.items() if on).replace("cpu_kernels", f"cpu_kernels_{want.cpu_isa}")
    engine = LLMEngine(engine_config(model_dir, 2, quantization="wint8"))
    try:
        info = engine.info()
        assert info["device"] == "cpu" and info["tensor_parallel_size"] == "2"
        assert (info["dtype"], info["kv_cache_dtype"]) == (want.dtype, want.kv_cache_dtype) == ("float32", "float32")
        assert info["kernels"] == kernels and info["kernels"].startswith("cpu_kernels_")
        assert info["quantization"] == "wint8"
        ranks = engine.executor.plan
        assert (ranks.dtype, ranks.kernels, ranks.cpu_isa) == (want.dtype, want.kernels, want.cpu_isa)
        assert ranks.quantization == "wint8"
    finally:
        engine.close()


# -- worker failures -----------------------------------------------------------------------------
@pytest.mark.slow
def test_worker_start_failure_names_the_rank_and_leaves_no_worker(tmp_path):
    model_dir = tc.make_checkpoint("llama_tied", tmp_path / "ck")
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["mlp_bias"] = True  # the weights have no MLP biases: every rank fails to load
    (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RuntimeError, match=r"tensor-parallel worker rank \d \(cpu\) failed \(start\): KeyError: .*bias"):
        LLMEngine(engine_config(model_dir, 2))
    assert wait_no_workers() == []


def test_killed_worker_fails_requests_in_flight(tmp_path):
    model_dir = tc.make_checkpoint("llama_tied", tmp_path / "ck")
    engine = LLMEngine(engine_config(model_dir, 2))
    pids = engine.executor.worker_pids
    assert sorted(pids) == sorted(tp_workers())
    failed = threading.Event()
    loop = EngineLoop(engine, on_failure=lambda reason: failed.set())
    first, outs = threading.Event(), []

    def cb(out):
        outs.append(out)
        first.set()

    try:
        params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        loop.submit("a", tc.prompts()[0], params, cb)
        loop.submit("b", tc.prompts()[1], params, cb)
        assert first.wait(120), "no output from the TP engine"
        os.kill(pids[1], signal.SIGKILL)
        assert failed.wait(60), "the engine did not notice the dead worker"
        errors = {o.request_id: o.error for o in outs if o.finish_reason == "error"}
        assert set(errors) == {"a", "b"}
        assert all(o.finished for o in outs if o.finish_reason == "error")
        assert f"rank 1 (pid {pids[1]}, cpu) killed by SIGKILL" in errors["a"]
        assert not loop.healthy
        assert wait_no_workers() == []
    finally:
        loop.shutdown()
        engine.close()


@pytest.mark.slow
def test_a_worker_that_dies_while_the_engine_is_idle_is_a_failure_at_once(tmp_path):
    """No step runs to notice it: the watchdog's liveness probe (the executor's dead_worker) does,
    so the instance is reported failed (and reloaded) before a request meets the dead rank."""
    from paddle_llm_triton.lifecycle.health import StallWatchdog

    model_dir = tc.make_checkpoint("llama_tied", tmp_path / "ck")
    engine = LLMEngine(engine_config(model_dir, 2))
    pids = engine.executor.worker_pids
    failures = []
    loop = EngineLoop(engine, on_failure=failures.append)
    dog = StallWatchdog({}, loop.declare_failed, max_step_s=0, poll_s=0.1, liveness=engine.executor.dead_worker)
    try:
        assert engine.executor.dead_worker() is None
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not failures and time.monotonic() < deadline:
            time.sleep(0.05)
        assert failures, "the dead worker was not noticed while the engine was idle"
        assert f"tensor-parallel worker rank 0 (pid {pids[0]}, cpu) killed by SIGKILL" in failures[0]
        assert not loop.healthy
        with pytest.raises(EngineDeadError, match="rank 0 .* killed by SIGKILL"):
            loop.submit("late", tc.prompts()[0], SamplingParams(max_tokens=4), lambda out: None)
    finally:
        dog.close()
        loop.shutdown()
        engine.close()
    assert engine.executor.dead_worker() is None  # a closed executor reports nothing
    assert wait_no_workers() == []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_workers_die_with_a_sigkilled_engine_process(tmp_path):
    """The engine's process is SIGKILLed (as a Triton stub can be): its workers go too."""
    import subprocess

    model_dir = tc.make_checkpoint("llama_tied", tmp_path / "ck")
    here = Path(__file__).resolve().parent
    # a `python -c` child does not get pytest's pythonpath: this folder (test_tp_config) and
    # tests/support (tiny_checkpoints, which test_tp_config imports)
    code = (f"import sys, time; sys.path[:0] = [{str(here)!r}, {str(here.parent / 'support')!r}]\n"
            "from test_tp_config import engine_config\n"
            "from paddle_llm_engine import LLMEngine\n"
            f"e = LLMEngine(engine_config({str(model_dir)!r}, 2))\n"
            "print('PIDS', *e.executor.worker_pids, flush=True)\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line, deadline = "", time.monotonic() + 240
        while not line.startswith("PIDS") and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert line.startswith("PIDS"), "the engine process did not start its workers"
        pids = [int(x) for x in line.split()[1:]]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "a worker outlived its engine process"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
