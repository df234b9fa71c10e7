"""Benchmark clients nobody here wrote, against the real server (docs/openai/clients.md).

aiperf (PyPI `aiperf`, NVIDIA's load generator that follows genai-perf) runs a short bounded profile,
REQUESTS (16) requests at concurrency 4, each asking for exactly OUT_TOKENS tokens (EOS ignored), and must end
with REQUESTS completed requests, 0 errors and exactly REQUESTS x OUT_TOKENS tokens counted by the engine
(`llm_generation_tokens_total` on Triton's metrics endpoint, read idle before and after):
- the OpenAI endpoint of the frontend: /v1/chat/completions, streamed (`--endpoint-type chat
  --streaming`);
- Triton's own HTTP generate_stream of `llm` (the vLLM contract: sampling_parameters as a JSON
  string) and of `ensemble` (TensorRT-LLM names; min_tokens = max_tokens since these names have no
  ignore_eos), through aiperf's `template` endpoint (a Jinja payload, `text_output` read from each
  SSE event).
genai-perf and perf_analyzer (Triton's gRPC service kind, `--backend vllm` / `tensorrtllm`) do not
run on this machine: every perf-analyzer wheel past the 0.1.0 placeholder is manylinux_2_38 and its
binary needs GLIBC_2.38 and GLIBCXX_3.4.32 (Debian 12 has 2.36); genai-perf only drives that binary.
docs/openai/clients.md says so with the error text.

aiperf lives in its own venv, build/perf-venv (perf_venv.py: pinned AIPERF_PIN; about 1.2 GB, 1-2
minutes of pip on first use, started in the background once collection is done, then a stamp makes
it instant), which the `aiperf` fixture waits for: it pulls transformers,
pandas, numpy 2 and more, which the project's pins (numpy 1.26.4) do not allow in .venv. No hub
access: --tokenizer is the local model folder (HF_HUB_OFFLINE=1 is removed from aiperf's environment:
aiperf 0.13 then refuses a local folder as a repo id).

Time: about 30-70 s per profile here (2 cores, aiperf's own start about 10 s), 2-4 minutes for the
file, plus the venv on first use.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import perf_venv
from metrics_util import is_idle, llm_value, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 420  # one profile; 16 x 8 tokens take 15-40 s here, aiperf's start ~10 s
REQUESTS, CONCURRENCY, OUT_TOKENS, IN_TOKENS = 16, 4, 8, 32


@pytest.fixture(scope="session")
def aiperf() -> Path:
    """build/perf-venv/bin/aiperf (perf_venv.py: installed in the background since collection ended,
    or now). A failed install fails the test with pip's last lines."""
    try:
        exe, note = perf_venv.ensure()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    print(f"\n[aiperf] {note}")
    return exe


def run_aiperf(exe: Path, out_dir: Path, args: list[str]) -> dict:
    """One `aiperf profile` (REQUESTS at CONCURRENCY, synthetic prompts of IN_TOKENS tokens from the
    local tokenizer, no UI, no server-metrics scraping) -> its profile_export_aiperf.json as a dict.
    AssertionError with aiperf's output tail when it exits non-zero or writes no export."""
    model_dir = REPO / "build" / "SmolLM2-135M-Instruct"
    cmd = [str(exe), "profile", *args, "--tokenizer", str(model_dir), "--request-count", str(REQUESTS),
           "--concurrency", str(CONCURRENCY), "--synthetic-input-tokens-mean", str(IN_TOKENS),
           "--synthetic-input-tokens-stddev", "0", "--random-seed", "7", "--request-timeout-seconds", "300",
           "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", str(out_dir)]
    env = dict(os.environ, NO_COLOR="1", COLUMNS="160")
    for name in ("PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # aiperf 0.13 cannot load a local
        env.pop(name, None)                         # tokenizer folder under HF_HUB_OFFLINE=1 (HFValidationError)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          cwd=out_dir.parent, timeout=RUN_TIMEOUT_S)
    (out_dir.parent / f"{out_dir.name}.log").write_text(proc.stdout)
    export = out_dir / "profile_export_aiperf.json"
    assert proc.returncode == 0 and export.is_file(), (
        f"aiperf exited {proc.returncode}; command {' '.join(cmd)}\n" + proc.stdout[-4000:])
    return json.loads(export.read_text())


def engine_counts(metrics_url: str) -> tuple[float, float]:
    """(llm_generation_tokens_total, llm_requests_total) once the engine is idle."""
    m, _ = wait_for(metrics_url, is_idle, timeout=60)
    return llm_value(m, "llm_generation_tokens_total"), llm_value(m, "llm_requests_total")


def check_profile(report: dict, before: tuple[float, float], after: tuple[float, float], what: str,
                  capsys) -> None:
    """REQUESTS completed, 0 errors, not cancelled; the engine generated exactly REQUESTS x OUT_TOKENS
    tokens for REQUESTS requests; aiperf's own count (it re-tokenizes the text, which can merge a token or two at the
    edges: 7 of 8 seen) within 2 tokens of OUT_TOKENS."""
    osl = report["output_sequence_length"]
    with capsys.disabled():
        print(f"\n[aiperf] {what}: {report['request_count']['avg']:.0f} requests in "
              f"{report['benchmark_duration']['avg']:.1f} s, errors {report['request_error_rate']['avg']:.1f}%, "
              f"output tokens/s {report['output_token_throughput']['avg']:.1f}, TTFT p50 "
              f"{report['time_to_first_token']['p50']:.0f} ms, ITL p50 {report['inter_token_latency']['p50']:.0f} ms")
    assert report["error_summary"] == [], report["error_summary"]
    assert report["request_error_rate"]["avg"] == 0.0
    assert report["was_cancelled"] is False and report["is_complete"] is True
    assert report["request_count"]["avg"] == REQUESTS
    assert osl["count"] == REQUESTS and OUT_TOKENS - 2 <= osl["min"] <= osl["max"] <= OUT_TOKENS + 2, osl
    gen = after[0] - before[0]
    reqs = after[1] - before[1]
    assert reqs == REQUESTS, f"the engine saw {reqs} requests, aiperf sent {REQUESTS}"
    assert gen == REQUESTS * OUT_TOKENS, f"the engine generated {gen} tokens, not {REQUESTS} x {OUT_TOKENS}"


# --------------------------------------------------------------------------- Triton's own endpoints

LLM_TEMPLATE = ('{"text_input": {{ text|tojson }}, "stream": true, "exclude_input_in_output": true, '
                '"sampling_parameters": "{\\"max_tokens\\": %d, \\"temperature\\": 0, \\"ignore_eos\\": true}"}'
                % OUT_TOKENS)
ENSEMBLE_TEMPLATE = ('{"text_input": {{ text|tojson }}, "max_tokens": %d, "min_tokens": %d, "temperature": 0.0, '
                     '"stream": true, "exclude_input_in_output": true}' % (OUT_TOKENS, OUT_TOKENS))


@pytest.mark.parametrize("model,template", [("llm", LLM_TEMPLATE), ("ensemble", ENSEMBLE_TEMPLATE)])
def test_aiperf_on_triton_generate_stream(triton_server, aiperf, tmp_path, capsys, model, template):
    tpl = tmp_path / f"{model}.json.j2"
    tpl.write_text(template)
    before = engine_counts(triton_server.metrics_url)
    report = run_aiperf(aiperf, tmp_path / "out", [
        "-m", model, "--endpoint-type", "template", "--custom-endpoint", f"/v2/models/{model}/generate_stream",
        "--streaming", "-u", triton_server.http_base, "--extra-inputs", f"payload_template:{tpl}",
        "--extra-inputs", "response_field:text_output"])
    after = engine_counts(triton_server.metrics_url)
    check_profile(report, before, after, f"Triton {model} generate_stream", capsys)


# --------------------------------------------------------------------------- the OpenAI endpoint


def test_aiperf_on_openai_chat_streaming(openai_server, aiperf, tmp_path, capsys):
    """aiperf's chat endpoint type as it drives vLLM / NIM: synthetic user turns, max_completion_tokens,
    SSE chunks; ignore_eos and temperature passed with --extra-inputs."""
    murl = openai_server.triton.metrics_url
    before = engine_counts(murl)
    report = run_aiperf(aiperf, tmp_path / "out", [
        "-m", openai_server.model, "--endpoint-type", "chat", "--streaming", "-u", openai_server.base,
        "--output-tokens-mean", str(OUT_TOKENS), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0"])
    after = engine_counts(murl)
    check_profile(report, before, after, "OpenAI /v1/chat/completions streamed", capsys)
