"""`make serve` with a setting and no tracked file changed (paddle_llm_launcher/overrides.py): the README server
(scripts/launch_triton.py, supervised) started with LLM_PARAMS="quantization=wint8
speculative_method=ngram" serves int8 weights with n-gram speculation (llm_engine_info says so, and a
request is served), the shipped config.pbtxt is byte for byte what git has, and an unknown key stops
the launcher before anything starts, naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clients import llm_stream, scrape_metrics
from supervised import REPO_ROOT, SupervisedServer

pytestmark = pytest.mark.e2e

SHIPPED = REPO_ROOT / "model_repository" / "llm" / "config.pbtxt"


def test_llm_params_turn_on_wint8_and_speculation_without_a_tracked_file_changing(smollm2_dir, tmp_path):
    before = SHIPPED.read_bytes()
    s = SupervisedServer(REPO_ROOT / "model_repository", smollm2_dir, tmp_path / "launcher.log",
                         env={"LLM_PARAMS": "quantization=wint8 speculative_method=ngram max_model_len=2048 num_kv_blocks=64"})
    try:
        s.wait(s.ready, 300, "ready")
        info = scrape_metrics(s.metrics_url).find("llm_engine_info", model="llm")
        assert info, "llm_engine_info missing"
        labels = info[0][0]
        assert labels["quantization"] == "wint8" and labels["speculative_method"].startswith("ngram:"), labels
        r = llm_stream(s.grpc_url, "The capital of France is", True, {"temperature": "0", "max_tokens": "8"},
                       timeout=120)
        assert r.error is None and r.text, r.error
        out = s.output()
        assert "llm parameters set: quantization=wint8 speculative_method=ngram max_model_len=2048 num_kv_blocks=64" in out, out[-2000:]
        assert f"serve_repository/{s.http_port}" in out
    finally:
        s.stop()
    assert SHIPPED.read_bytes() == before
    # a healthy start, a request and a drain print no error line (Triton's CUDA-driver line on a host
    # without one is relayed as an info line by the launcher)
    triton_log = s.server_log.read_text(errors="replace")
    assert "successfully loaded 'llm'" in triton_log, triton_log[-2000:]
    errors = [line for line in triton_log.splitlines() if line.startswith("E")]
    assert not errors, errors
    assert subprocess.run(["git", "diff", "--quiet", "--", "model_repository"], cwd=REPO_ROOT).returncode == 0


def test_an_unknown_parameter_stops_the_start_naming_it(smollm2_dir):
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "launch_triton.py"), "--model-dir", smollm2_dir,
                           "--http-port", "1", "--set", "quantisation=wint8"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown llm parameter(s) quantisation" in proc.stdout
