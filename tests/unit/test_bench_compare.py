"""The pure parts of benchmarks/compare.py's tooling: the GGUF q/k permutation, tensor names, the
load statistics every system is measured with (client_examples/load_stats.summarize_records) and the
report (benchmarks/comparison/report.build_report)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gguf_export():
    return _load("gguf_export", REPO_ROOT / "benchmarks" / "gguf_export.py")


@pytest.fixture(scope="module")
def load_stats():
    return _load("load_stats", REPO_ROOT / "client_examples" / "load_stats.py")


@pytest.mark.parametrize("n_head, head_dim, cols", [(9, 64, 7), (3, 64, 5), (4, 8, 1)])
def test_permute_is_the_inverse_of_prepare_models_unpermute(gguf_export, n_head, head_dim, cols):
    pm = gguf_export.load_prepare_model()
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, cols)).astype(np.float32)
    assert np.array_equal(gguf_export.permute(pm.unpermute(w, n_head), n_head), w)
    assert np.array_equal(pm.unpermute(gguf_export.permute(w, n_head), n_head), w)
    # llama.cpp's layout: within a head, row pairs (i, i + head_dim/2) become neighbours
    p = gguf_export.permute(w, n_head)
    assert np.array_equal(p[1], w[head_dim // 2])


def test_gguf_names_are_prepare_models_names_backwards(gguf_export):
    pm = gguf_export.load_prepare_model()
    for gguf_suffix, hf_suffix in pm.LAYER_MAP.items():
        assert gguf_export.hf_to_gguf_name(f"model.layers.7.{hf_suffix}", pm.LAYER_MAP) == f"blk.7.{gguf_suffix}"
    assert gguf_export.hf_to_gguf_name("model.embed_tokens.weight", pm.LAYER_MAP) == "token_embd.weight"
    with pytest.raises(KeyError):
        gguf_export.hf_to_gguf_name("model.layers.0.unknown.weight", pm.LAYER_MAP)


def _rec(lg, index, sent, times, tokens=None):
    r = lg.RequestRecord(index)
    r.sent, r.times, r.tokens, r.final = sent, times, tokens or [1] * len(times), times[-1]
    return r


def test_decode_window_is_the_union_of_decode_intervals(load_stats):
    lg = load_stats
    recs = [_rec(lg, 0, 0.0, [1.0, 2.0, 3.0]), _rec(lg, 1, 0.0, [2.5, 4.0]), _rec(lg, 2, 5.0, [6.0, 7.0])]
    assert lg.decode_window(recs) == pytest.approx((4.0 - 1.0) + (7.0 - 6.0))


def test_summarize_records_counts_tokens_after_the_first(load_stats):
    lg = load_stats
    # two requests in one static batch: first token at 1.0, then one token every 0.5 s
    times = [1.0, 1.5, 2.0, 2.5]
    recs = [_rec(lg, 0, 0.0, list(times)), _rec(lg, 1, 0.0, list(times))]
    s = lg.summarize_records(recs, 0.0, 2.5, prompt_tokens=False)
    assert s["total_output_tokens"] == 8
    assert s["decode_tokens_per_s"] == pytest.approx(6 / 1.5)
    assert s["ttft_s"]["p50"] == pytest.approx(1.0)
    assert s["itl_s"]["p50"] == pytest.approx(0.5)
    assert s["output_tokens_per_s"] == pytest.approx(8 / 2.5)
    assert s["requests_done"] == 2 and s["requests_failed"] == 0


def test_summarize_records_spreads_a_multi_token_response_over_its_tokens(load_stats):
    lg = load_stats
    r = _rec(lg, 0, 0.0, [1.0, 2.0], tokens=[1, 4])
    s = lg.summarize_records([r], 0.0, 2.0, prompt_tokens=False)
    assert s["itl_s"]["count"] == 4 and s["itl_s"]["p50"] == pytest.approx(0.25)
    assert s["decode_tokens_per_s"] == pytest.approx(4.0)


def test_build_report_names_the_host_and_the_ratios(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))  # the package comparison/ lives there
    report = importlib.import_module("comparison.report")
    lv = lambda d: {"decode_tokens_per_s": d, "output_tokens_per_s": d, "of_limit": d / 50,  # noqa: E731
                    "ttft_s": {"p50": 0.1, "p90": 0.2, "p99": 0.3}, "itl_s": {"p50": 0.01, "p90": 0.02, "p99": 0.03},
                    "requests_done": 1, "requests_cut_at_time_cap": 0, "requests_failed": 0}
    summary = {
        "host": {"cpu": "Test CPU 9000", "isa": ["avx2", "fma"], "cores": 2, "threads": 2},
        "bandwidth": {"bytes_per_s": 25e9, "method": "numpy"}, "concurrency": [1, 8],
        "limit_per_seq": {"fp32": 46.0}, "weight_bytes": {"fp32": 538e6}, "model": "m", "max_tokens": 16,
        "requests_per_stream": 1, "prompt_tokens_min": 36, "prompt_tokens_max": 40, "ours_suffix": "",
        "date": "2026-01-01", "notes": {"hf": "no ref venv"}, "agreement": [],
        "results": {"offline": {"info": "x", "levels": {1: lv(10.0), 8: lv(40.0)}},
                    "llm": {"info": "x", "levels": {1: lv(9.0), 8: lv(36.0)}},
                    "llamacpp-f32": {"info": "x", "levels": {1: lv(20.0), 8: lv(80.0)}}},
    }
    text, md = report.build_report(summary)
    assert "Test CPU 9000 (avx2, fma)" in text and "Test CPU 9000" in md
    assert "NOT RUN: no ref venv" in text
    assert "0.50x" in text and "0.90x" in text  # offline / llama.cpp, llm / offline
    header = md.splitlines()[2]
    assert "ours offline / llama.cpp F32" in header and "ours Triton llm / ours offline" in header
    assert md.splitlines()[4].startswith("| 1 | 10.0 | 9.0 | 20.0 | 0.50x | 0.90x | 20% |")


def test_every_module_the_comparison_loads_lazily_exists(monkeypatch):
    """compare.py reaches sibling files only when a system runs (the Triton systems load the repo
    editor of the test support): a moved file failed only in a full benchmark run, once."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    common = importlib.import_module("comparison.common")
    for name in ("bench_engine", "bench_engine_report", "gguf_export", "load_stats", "load_client", "repo_edit",
                 "launcher"):
        assert getattr(common, name)() is not None, name
    assert callable(common.repo_edit().set_config_parameter)


def test_each_system_is_held_to_the_limit_of_its_own_weight_format(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    measure = importlib.import_module("comparison.measure")
    lv = lambda: {1: {"decode_tokens_per_s": 50.0}}  # noqa: E731
    results = {"offline": {"levels": lv()}, "llamacpp-q4_1": {"levels": lv()}, "llamacpp-f32": {"levels": lv()},
               "hf": {"levels": lv()}}
    limit = measure.apply_limits(results, {"fp32": 500.0, "wint4": 100.0, "q4_1": 125.0}, 1000.0)
    assert limit == {"fp32": 2.0, "wint4": 10.0, "q4_1": 8.0}
    assert results["offline"]["levels"][1]["of_limit"] == 5.0      # ours in wint4: the wint4 bytes
    assert results["llamacpp-q4_1"]["levels"][1]["of_limit"] == 6.25  # the Q4_1 file's bytes
    assert results["llamacpp-f32"]["levels"][1]["of_limit"] == 25.0 and results["hf"]["levels"][1]["of_limit"] == 25.0
