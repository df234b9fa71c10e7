"""A failing engine step (test-only fault injection: config.pbtxt parameter fault_inject_after_steps on
a copy of the repository) fails the streams in flight with a clear error instead of hanging them, and
afterwards behaves as docs/operations/engine_failure.md documents: every new request fails at once with an
INTERNAL error naming the original failure, llm_engine_healthy is 0, the log says why, and Triton
2.51 keeps reporting the model ready (a Python model cannot change its readiness)."""

from __future__ import annotations

import time

import pytest
import requests

from clients import GrpcStream, ensemble_inputs, ensemble_stream, llm_inputs, run_concurrently, scrape_metrics
from http_clients import http_generate
from repo_edit import set_config_parameter

pytestmark = pytest.mark.e2e

FAULT_AFTER_STEPS = 40
LONG = {"temperature": "0", "max_tokens": "300", "ignore_eos": "true"}


def _faulty(repo):
    cfg = repo / "llm" / "config.pbtxt"
    set_config_parameter(cfg, "fault_inject_after_steps", str(FAULT_AFTER_STEPS))
    set_config_parameter(cfg, "num_kv_blocks", "64")
    set_config_parameter(cfg, "max_model_len", "2048")


@pytest.fixture(scope="module")
def server(triton_server_factory):
    return triton_server_factory(_faulty)


def _collect(model, inputs, server):
    return GrpcStream(server.grpc_url, model, inputs, timeout=60).collect()


def test_streams_in_flight_get_a_clear_error_then_requests_fail_fast(server):
    # 1. two streams in flight (one per entry point) when the engine fails. A hung stream is caught by
    # events, not by a wall clock: each stream must end with the engine-failure error, after fewer
    # responses than the steps that ran (a stream that ran on would end normally or hit the generous
    # time-outs of GrpcStream / run_concurrently and fail with their own message).
    llm_r, ens_r = run_concurrently([
        lambda: _collect("llm", llm_inputs("Once upon a time", True, LONG), server),
        lambda: _collect("ensemble", ensemble_inputs("Tell me a story", max_tokens=300, min_tokens=300,
                                                     temperature=0.0, stream=True), server),
    ], timeout=300)
    for name, r in (("llm", llm_r), ("ensemble", ens_r)):
        assert r.error is not None, f"{name}: no error after the engine failed ({len(r.responses)} responses)"
        msg = str(r.error)
        assert "engine failure" in msg and "fault injected after" in msg, f"{name}: unclear error {msg!r}"
        assert r.responses, f"{name}: the failure should come after some output"
        assert len(r.responses) <= FAULT_AFTER_STEPS, name
    assert str(ens_r.error).startswith("in ensemble 'ensemble', ")

    # 2. afterwards: new requests fail at once, naming the original failure (gRPC and HTTP, both models)
    for model, inputs in (("llm", llm_inputs("Hello", True, {"max_tokens": "4"})),
                          ("ensemble", ensemble_inputs("Hello", max_tokens=4, stream=True))):
        t1 = time.monotonic()
        r = _collect(model, inputs, server)
        took = time.monotonic() - t1
        assert r.error is not None and not r.responses, f"{model} served after the engine failed"
        msg = str(r.error)
        assert "is not serving" in msg and "engine failed earlier" in msg and "fault injected" in msg, msg
        # "At once": no engine step is waited for. The bound is generous for a busy shared host; a
        # request queued behind the dead engine would wait for the stream's 60 s time-out instead.
        assert took < 20.0, f"{model}: the error took {took:.2f} s"
    h = http_generate(server.http_base, "llm", {"text_input": "Hello", "sampling_parameters": '{"max_tokens": 4}'})
    assert h.status >= 400 and "engine failed earlier" in (h.error or ""), (h.status, h.body)  # 2.51 answers 400

    # 3. what Triton and the metrics say
    assert requests.get(f"{server.http_base}/v2/models/llm/ready", timeout=5).status_code == 200  # 2.51: cannot change
    m = scrape_metrics(server.metrics_url)
    assert m.value("llm_engine_healthy", model="llm") == 0
    assert m.value("llm_requests_total", model="llm", finish_reason="error") >= 4
    log = server.log_path.read_text(errors="replace")
    assert "engine step failed" in log and "InjectedFault" in log
    assert "engine failed (InjectedFault: fault injected after" in log

    # 4. the rest of the server keeps working (preprocessing still validates)
    bad = ensemble_stream(server.grpc_url, "", max_tokens=4)
    assert bad.error is not None and "text_input" in str(bad.error)
