"""Limits and deadlines against the real tritonserver (docs/operations/limits.md):
- a request's timeout (tritonclient gRPC `timeout=`, HTTP generate `"parameters": {"timeout": N}`,
  microseconds) ends the request with "deadline exceeded: ..." on both models, its KV blocks freed
  and the request counted in llm_requests_timed_out_total;
- on a copy of the repository with max_num_seqs 1, max_num_waiting 2 and max_request_seconds 8:
  requests past the limit are refused at once (before the running request ends) on gRPC and HTTP,
  both models, with the limit named, and counted in llm_requests_rejected_total{reason="queue_full"};
  the admitted ones end at max_request_seconds, running or waiting;
- on the same copy, scheduling_policy "priority": with the one slot busy and a request waiting (both
  priority 5), a priority-0 request preempts the running one and finishes before the waiting one
  starts; every text equals the text of the same request run alone.
Triton 2.51's mapping of the UNAVAILABLE code, measured: the gRPC stream carries only the message
(tritonclient's status() is None), HTTP generate / generate_stream answer 400."""

from __future__ import annotations

import re
import time

import pytest

from clients import GrpcStream, decode_str, ensemble_inputs, llm_inputs, sampling_json, scrape_metrics
from http_clients import http_generate, http_generate_stream
from metrics_util import is_idle, llm_value, wait_for
from repo_edit import set_config_parameter

pytestmark = pytest.mark.e2e

LONG = {"temperature": "0", "max_tokens": "4000", "ignore_eos": "true"}
LONG_ENSEMBLE = dict(max_tokens=4000, min_tokens=4000, temperature=0.0, stream=True)
PROMPT = "Tell me a very long story about a lighthouse keeper."
DEADLINE = re.compile(r"deadline exceeded: the request ran (\d+\.\d+) s \((timeout|max_request_seconds) "
                      r"([\d.]+) s\); (\d+ tokens? generated|aborted before its first token)")


def deadline_of(message: str) -> tuple[float, str, float]:
    """(seconds ran, which limit, its value) from a deadline error; fails on any other message."""
    m = DEADLINE.search(message or "")
    assert m, f"not a deadline error: {message!r}"
    return float(m.group(1)), m.group(2), float(m.group(3))


def counters(murl: str) -> dict:
    m = scrape_metrics(murl)
    return {"timed_out": llm_value(m, "llm_requests_timed_out_total"),
            "abort": llm_value(m, "llm_requests_total", finish_reason="abort"),
            "error": llm_value(m, "llm_requests_total", finish_reason="error"),
            "queue_full": llm_value(m, "llm_requests_rejected_total", reason="queue_full")}


# -- a request's own timeout (default repository) ----------------------------------------------------

def test_grpc_stream_timeout_ends_llm_and_ensemble_streams_with_the_deadline(triton_server):
    murl = triton_server.metrics_url
    before = counters(murl)
    streams = {"llm": GrpcStream(triton_server.grpc_url, "llm", llm_inputs(PROMPT, True, LONG),
                                 request_timeout_us=2_000_000),
               "ensemble": GrpcStream(triton_server.grpc_url, "ensemble", ensemble_inputs(PROMPT, **LONG_ENSEMBLE),
                                      request_timeout_us=2_000_000)}
    results = {k: s.collect() for k, s in streams.items()}
    for name, r in results.items():
        assert r.error is not None, f"{name}: ran to the end ({len(r.responses)} responses) despite the timeout"
        assert r.responses, f"{name}: the deadline should come after some output"
        msg = r.error.message()
        ran, source, limit = deadline_of(msg)
        assert (source, limit) == ("timeout", 2.0) and ran >= 2.0, msg
        assert r.error.status() is None  # Triton 2.51's gRPC stream carries the message only
    assert results["ensemble"].error.message().startswith("in ensemble 'ensemble', deadline exceeded: ")
    m, _ = wait_for(murl, lambda m: is_idle(m) and llm_value(m, "llm_requests_timed_out_total")
                    >= before["timed_out"] + 2, timeout=30)
    assert llm_value(m, "llm_requests_timed_out_total") == before["timed_out"] + 2
    assert llm_value(m, "llm_requests_total", finish_reason="abort") == before["abort"] + 2
    assert llm_value(m, "llm_requests_total", finish_reason="error") == before["error"]


def test_http_generate_timeout_parameter_reaches_the_engine(triton_server):
    """HTTP generate puts "parameters": {"timeout": N} into the request's parameters (Triton 2.51
    does not set request.timeout() from it); llm and the ensemble read it there."""
    http, murl = triton_server.http_base, triton_server.metrics_url
    before = counters(murl)
    s = http_generate_stream(http, "llm", {"text_input": PROMPT, "stream": True, "sampling_parameters": sampling_json(LONG),
                                           "parameters": {"timeout": 1_500_000}})
    assert s.status == 200 and s.text and s.events[-1].get("error"), (s.status, s.events[-1:])
    assert deadline_of(s.error)[1:] == ("timeout", 1.5)
    g = http_generate(http, "llm", {"text_input": PROMPT, "sampling_parameters": sampling_json(LONG),
                                    "parameters": {"timeout": 1_500_000}})
    assert g.status == 400, (g.status, g.body)  # 2.51's generate endpoint: every model error is 400
    assert deadline_of(g.error)[1:] == ("timeout", 1.5)
    e = http_generate_stream(http, "ensemble", {"text_input": PROMPT, "max_tokens": 4000, "min_tokens": 4000,
                                                "temperature": 0.0, "stream": True, "parameters": {"timeout": 1_500_000}})
    assert e.error and e.error.startswith("in ensemble 'ensemble', deadline exceeded: "), (e.status, e.error)
    assert deadline_of(e.error)[1:] == ("timeout", 1.5)
    bad = http_generate(http, "llm", {"text_input": PROMPT, "parameters": {"timeout": -3}})
    assert bad.status == 400 and bad.error.startswith("timeout: "), bad.error
    m, _ = wait_for(murl, is_idle, timeout=30)
    assert llm_value(m, "llm_requests_timed_out_total") == before["timed_out"] + 3


# -- admission limit and max_request_seconds (edited copy) --------------------------------------------

MAX_REQUEST_SECONDS = 8


def _limits(repo):
    cfg = repo / "llm" / "config.pbtxt"
    set_config_parameter(cfg, "max_num_seqs", "1")
    set_config_parameter(cfg, "max_num_waiting", "2")
    set_config_parameter(cfg, "max_request_seconds", str(MAX_REQUEST_SECONDS))
    set_config_parameter(cfg, "scheduling_policy", "priority")


@pytest.fixture(scope="module")
def limited(triton_server_factory):
    return triton_server_factory(_limits)


BUSY = "server busy: 2 requests waiting (max_num_waiting 2); retry later"


def test_flood_is_refused_at_once_and_admitted_requests_end_at_max_request_seconds(limited):
    url, http, murl = limited.grpc_url, limited.http_base, limited.metrics_url
    before = counters(murl)
    info = scrape_metrics(murl).find("llm_engine_info", model="llm")
    assert [(l["max_num_seqs"], l["max_num_waiting"]) for l, _ in info] == [("1", "2")]

    running = GrpcStream(url, "llm", llm_inputs(PROMPT, True, LONG), timeout=60)
    first, err = running.next()
    assert err is None, err
    # two waiting: one from a direct client (its own timeout is longer than max_request_seconds) and
    # one through the ensemble (its llm step is the request that waits)
    waiting = [GrpcStream(url, "llm", llm_inputs(PROMPT, True, LONG), timeout=60, request_timeout_us=60_000_000),
               GrpcStream(url, "ensemble", ensemble_inputs(PROMPT, **LONG_ENSEMBLE), timeout=60)]
    wait_for(murl, lambda m: llm_value(m, "llm_num_requests_waiting") == 2, timeout=30)

    took = {}

    def timed(name, fn):
        t = time.monotonic()
        out = fn()
        took[name] = time.monotonic() - t
        return out

    g_llm = timed("grpc llm", lambda: GrpcStream(url, "llm", llm_inputs("Hi", True, {"max_tokens": "4"})).collect())
    g_ens = timed("grpc ensemble", lambda: GrpcStream(url, "ensemble", ensemble_inputs("Hi", max_tokens=4)).collect())
    h_gen = timed("http generate llm", lambda: http_generate(http, "llm", {"text_input": "Hi",
                                                                           "sampling_parameters": '{"max_tokens": 4}'}))
    h_str = timed("http generate_stream llm", lambda: http_generate_stream(
        http, "llm", {"text_input": "Hi", "stream": True, "sampling_parameters": '{"max_tokens": 4}'}))
    h_ens = timed("http generate ensemble", lambda: http_generate(http, "ensemble", {"text_input": "Hi", "max_tokens": 4}))
    refused_at = time.monotonic()
    print("\nrefusal latency past max_num_waiting: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in took.items()))

    for r in (g_llm, g_ens):
        assert r.error is not None and not r.responses
        assert r.error.message() in (BUSY, f"in ensemble 'ensemble', {BUSY}"), r.error.message()
        assert r.error.status() is None  # Triton 2.51's gRPC stream: the message, not the code
    for h in (h_gen, h_str, h_ens):
        assert h.status == 400 and BUSY in (h.error or ""), (h.status, h.error)  # 2.51 generate: 400

    # the admitted ones end at max_request_seconds, whether running or still waiting
    rest = running.collect()
    ended_at = running.t0 + rest.elapsed_s
    assert refused_at < ended_at, "the refusals waited for the running request"
    ran, source, limit = deadline_of(rest.error.message())
    assert (source, limit) == ("max_request_seconds", MAX_REQUEST_SECONDS) and ran >= MAX_REQUEST_SECONDS
    for s in waiting:
        r = s.collect()
        assert r.error is not None, "a waiting request outlived max_request_seconds"
        assert deadline_of(r.error.message())[1:] == ("max_request_seconds", MAX_REQUEST_SECONDS)
    assert r.error.message().startswith("in ensemble 'ensemble', deadline exceeded: ")

    m, _ = wait_for(murl, lambda m: is_idle(m) and llm_value(m, "llm_requests_timed_out_total")
                    >= before["timed_out"] + 3, timeout=30)
    assert llm_value(m, "llm_requests_rejected_total", reason="queue_full") == before["queue_full"] + 5
    assert llm_value(m, "llm_requests_total", finish_reason="error") == before["error"] + 5
    assert llm_value(m, "llm_requests_timed_out_total") == before["timed_out"] + 3
    assert llm_value(m, "llm_kv_cache_used_blocks") == 0
    for reason in ("invalid", "not_serving", "draining"):  # registered at 0
        assert [v for _, v in m.find("llm_requests_rejected_total", model="llm", reason=reason)] == [0]

    # room again: a short request completes
    ok = GrpcStream(url, "llm", llm_inputs("Hi", True, {"max_tokens": "4", "temperature": "0"})).collect()
    ok.raise_for_error()


def test_openai_frontend_answers_503_in_openai_form_while_the_server_is_full(limited, smollm2_dir, tmp_path):
    """The OpenAI frontend in front of the full server: a request past max_num_waiting is a 503 with
    OpenAI's error body naming the limit (streamed or not), at once, not a hang or a 500."""
    openai = pytest.importorskip("openai")  # the frontend needs Python >= 3.11 (pyproject markers)
    import paddle_llm_launcher as launcher
    from paddle_llm_launcher.frontend import start_frontend

    front = start_frontend(limited.grpc_port, limited.metrics_port, launcher.free_port(), smollm2_dir,
                           log_path=tmp_path / "openai_frontend.log", drain_grace=5.0, log=lambda line: None)
    streams = []
    try:
        front.wait_ready(60)
        url, murl = limited.grpc_url, limited.metrics_url
        wait_for(murl, is_idle, timeout=30)
        streams.append(GrpcStream(url, "llm", llm_inputs(PROMPT, True, LONG), timeout=60))
        assert streams[0].next()[1] is None
        streams += [GrpcStream(url, "llm", llm_inputs(PROMPT, True, LONG), timeout=60) for _ in range(2)]
        wait_for(murl, lambda m: llm_value(m, "llm_num_requests_waiting") == 2, timeout=30)

        client = openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=30)
        for stream in (False, True):
            t0 = time.monotonic()
            with pytest.raises(openai.APIStatusError) as ei:
                r = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=4, stream=stream)
                list(r) if stream else None
            took = time.monotonic() - t0
            err = ei.value.body if isinstance(ei.value.body, dict) else {}
            assert ei.value.status_code == 503, (ei.value.status_code, ei.value.body)
            assert "max_num_waiting 2" in err.get("message", ""), ei.value.body
            assert set(err) >= {"message", "type", "param", "code"}, ei.value.body
            assert took < MAX_REQUEST_SECONDS / 2, f"the refusal took {took:.1f} s"
    finally:
        for s in streams:
            s.cancel()
        front.stop(10)
    wait_for(limited.metrics_url, is_idle, timeout=30)


def test_an_urgent_request_preempts_the_running_one_and_outputs_do_not_change(limited):
    url, murl = limited.grpc_url, limited.metrics_url
    prompts = {"running": "Describe a harbour at dawn.", "waiting": "Describe a forest at night.",
               "urgent": "Name three colours."}

    def params(priority=None, max_tokens=32):
        sp = {"temperature": "0", "max_tokens": str(max_tokens), "ignore_eos": "true"}
        return sp if priority is None else {**sp, "priority": str(priority)}

    alone = {k: GrpcStream(url, "llm", llm_inputs(p, True, params(max_tokens=8 if k == "urgent" else 32)),
                           timeout=60).collect() for k, p in prompts.items()}
    for r in alone.values():
        r.raise_for_error()
    before = llm_value(scrape_metrics(murl), "llm_preemptions_total")

    running = GrpcStream(url, "llm", llm_inputs(prompts["running"], True, params(5)), timeout=60)
    first, err = running.next()
    assert err is None, err
    waiting = GrpcStream(url, "llm", llm_inputs(prompts["waiting"], True, params(5)), timeout=60)
    wait_for(murl, lambda m: llm_value(m, "llm_num_requests_waiting") == 1, timeout=30)
    urgent = GrpcStream(url, "llm", llm_inputs(prompts["urgent"], True, params(0, 8)), timeout=60).collect()
    urgent.raise_for_error()
    # one slot: the waiting request (priority 5, after the preempted one) cannot have started yet;
    # under fcfs the urgent request would have waited for both
    with pytest.raises(TimeoutError):
        waiting.next(timeout=0.0)
    rest, w = running.collect(), waiting.collect()
    rest.raise_for_error()
    w.raise_for_error()
    assert urgent.text == alone["urgent"].text
    assert decode_str(first, "text_output") + rest.text == alone["running"].text
    assert w.text == alone["waiting"].text
    wait_for(murl, lambda m: llm_value(m, "llm_preemptions_total") >= before + 1, timeout=10)
