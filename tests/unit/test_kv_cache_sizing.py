"""KV cache size from a memory budget: num_kv_blocks wins, then kv_cache_memory_fraction of the memory
available after the weights are loaded, then kv_cache_memory_bytes; the fallback when the device does
not report its memory; the start-up log; config.pbtxt parsing of the (float) setting."""

from __future__ import annotations

import logging

import pytest

from paddle_llm_engine import EngineConfig, LLMEngine
from paddle_llm_engine.platforms import device as platforms
from paddle_llm_engine.platforms import CpuPlatform
from paddle_llm_triton.config_params import engine_config_from_triton
from tiny_model import HEAD_DIM, KV_HEADS, LAYERS

BLOCK = 16
BYTES_PER_BLOCK = 2 * LAYERS * BLOCK * KV_HEADS * HEAD_DIM * 4  # K and V, fp32


def engine(model_dir: str, **kw) -> LLMEngine:
    # an fp32 cache, whatever "auto" resolves to (BYTES_PER_BLOCK)
    cfg = dict(model_dir=model_dir, device="cpu", block_size=BLOCK, max_model_len=128, num_threads=1,
               kv_cache_dtype="float32")
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


@pytest.fixture
def fake_free(monkeypatch):
    """Make the CPU platform report `box[0]` bytes available (None = unknown)."""
    box = [None]
    monkeypatch.setattr(CpuPlatform, "available_memory", lambda self, device, ranks_on_host=1: box[0])
    return box


def test_fraction_of_available_memory(tiny_model_dir, fake_free, caplog):
    fake_free[0] = 1000 * BYTES_PER_BLOCK + 123
    with caplog.at_level(logging.INFO):
        eng = engine(tiny_model_dir, kv_cache_memory_fraction=0.25, kv_cache_memory_bytes=7 * 2**20)
    assert eng.executor.num_kv_blocks == 250
    assert eng.block_manager.num_blocks == 250
    assert eng.executor.worker.kv_caches[0][0].shape == [KV_HEADS, 250 * BLOCK, HEAD_DIM]
    text = caplog.text
    assert "250 blocks x 16 tokens = 4000 tokens max in flight" in text
    assert "kv_cache_memory_fraction 0.25" in text
    assert "max concurrent tokens 4000" in text


def test_explicit_blocks_win_over_fraction(tiny_model_dir, fake_free):
    fake_free[0] = 1000 * BYTES_PER_BLOCK
    eng = engine(tiny_model_dir, num_kv_blocks=40, kv_cache_memory_fraction=0.5)
    assert eng.executor.num_kv_blocks == 40


def test_fraction_wins_over_bytes_and_bytes_is_default(tiny_model_dir, fake_free):
    fake_free[0] = 100 * BYTES_PER_BLOCK
    assert engine(tiny_model_dir, kv_cache_memory_fraction=1.0,
                  kv_cache_memory_bytes=500 * BYTES_PER_BLOCK).executor.num_kv_blocks == 100
    assert engine(tiny_model_dir, kv_cache_memory_bytes=60 * BYTES_PER_BLOCK).executor.num_kv_blocks == 60


def test_unknown_free_memory_falls_back_with_warning(tiny_model_dir, fake_free, caplog):
    fake_free[0] = None
    with caplog.at_level(logging.WARNING):
        eng = engine(tiny_model_dir, kv_cache_memory_fraction=0.5, kv_cache_memory_bytes=33 * BYTES_PER_BLOCK)
    assert eng.executor.num_kv_blocks == 33
    assert any(r.levelno == logging.WARNING and "kv_cache_memory_fraction" in r.getMessage()
               and "kv_cache_memory_bytes" in r.getMessage() for r in caplog.records)


def test_budget_too_small_for_one_sequence_names_the_settings(tiny_model_dir, fake_free):
    fake_free[0] = 4 * BYTES_PER_BLOCK  # max_model_len 128 needs 8 blocks
    with pytest.raises(ValueError) as ei:
        engine(tiny_model_dir, kv_cache_memory_fraction=1.0)
    assert "kv_cache_memory_fraction" in str(ei.value) and "max_model_len 128" in str(ei.value)


def test_real_host_memory_on_cpu(tiny_model_dir):
    """No fake: the CPU runner reads MemAvailable; a small fraction gives a cache of that size."""
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    got = platforms.host_available_memory()
    assert got is not None and abs(got - avail) < 0.25 * avail + 256 * 2**20
    frac = 2000 * BYTES_PER_BLOCK / avail  # about 2000 blocks (16 MiB) whatever the host
    eng = engine(tiny_model_dir, kv_cache_memory_fraction=frac)
    assert 1000 < eng.executor.num_kv_blocks < 4000


def test_proc_meminfo_used_without_psutil(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_psutil(name, *a, **kw):
        if name == "psutil":
            raise ImportError("no psutil")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    v = platforms.host_available_memory()
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    assert v is not None and abs(v - avail) < 0.25 * avail + 256 * 2**20


def test_gcu_memory_from_paddle_device_api(monkeypatch):
    """Total memory from the plug-in through core.get_device_properties(type, id) (the public
    paddle.device.get_device_properties refuses custom devices), minus what Paddle reserved."""
    import paddle

    class Props:
        total_memory = 32 * 2**30

    calls = []
    monkeypatch.setattr(paddle.base.core, "get_device_properties", lambda t, i: calls.append((t, i)) or Props())
    monkeypatch.setattr(paddle.device, "memory_reserved", lambda d: 3 * 2**30, raising=False)
    assert platforms.gcu_available_memory("gcu:1") == 29 * 2**30
    assert calls == [("gcu", 1)]


def test_gcu_memory_api_absent_gives_none(monkeypatch, caplog):
    """On this CPU build paddle.device.memory_reserved raises: no crash, None and a warning."""
    import paddle

    class Props:
        total_memory = 0

    monkeypatch.setattr(paddle.base.core, "get_device_properties", lambda t, i: Props())
    with caplog.at_level(logging.WARNING):
        assert platforms.gcu_available_memory("gcu:0") is None  # memory_reserved: not on CPU paddle
    monkeypatch.setattr(paddle.device, "memory_reserved", lambda d: 0, raising=False)
    assert platforms.gcu_available_memory("gcu:0") is None  # total_memory 0: not implemented
    assert "gcu:0" in caplog.text


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_fraction_out_of_range_rejected(tiny_model_dir, bad):
    with pytest.raises(ValueError) as ei:
        engine(tiny_model_dir, num_kv_blocks=16, kv_cache_memory_fraction=bad)
    assert "kv_cache_memory_fraction" in str(ei.value)


def _pbtxt(**params) -> dict:
    return {"parameters": {k: {"string_value": v} for k, v in params.items()}}


def test_config_pbtxt_parses_the_fraction_as_float():
    cfg = engine_config_from_triton(_pbtxt(model_dir="/m", kv_cache_memory_fraction="0.85", num_kv_blocks="0"), {})
    assert cfg.kv_cache_memory_fraction == 0.85 and isinstance(cfg.kv_cache_memory_fraction, float)
    assert cfg.num_kv_blocks == 0
    assert engine_config_from_triton(_pbtxt(model_dir="/m", kv_cache_memory_fraction="0"), {}
                                     ).kv_cache_memory_fraction == 0.0
    assert engine_config_from_triton(_pbtxt(model_dir="/m", kv_cache_memory_fraction=""), {}
                                     ).kv_cache_memory_fraction == 0.0  # empty: the default


@pytest.mark.parametrize("params,needle", [
    (dict(kv_cache_memory_fraction="half"), "kv_cache_memory_fraction must be a"),
    (dict(num_kv_blocks="1.5"), "num_kv_blocks must be an integer"),
    (dict(kv_cache_fraction="0.5"), "unknown parameters"),
])
def test_config_pbtxt_rejects_bad_values(params, needle):
    with pytest.raises(ValueError) as ei:
        engine_config_from_triton(_pbtxt(model_dir="/m", **params), {})
    assert needle in str(ei.value)


def test_shipped_config_pbtxt_parameters_are_all_known():
    """Every parameter in model_repository/llm/config.pbtxt is accepted, and the fraction is there, off."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "model_repository" / "llm" / "config.pbtxt").read_text()
    params = dict(re.findall(r'^[ \t]*parameters\s*\{\s*key:\s*"(\w+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text, re.M))
    assert params["kv_cache_memory_fraction"] == "0"
    params["model_dir"] = "/m"
    cfg = engine_config_from_triton(_pbtxt(**params), {})
    assert cfg.kv_cache_memory_fraction == 0.0
