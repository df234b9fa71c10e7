"""stream_interval and cancellation_check_period_ms through the real tritonserver
(docs/contracts/llm.md, "Streaming under load"), on a copy of the repository with stream_interval 4 and cancellation_check_period_ms 300:
- a greedy `llm` gRPC stream of 10 tokens arrives as 1 + 4 + 4 + 1 tokens (num_output_tokens per
  response; fewer responses when the stream fell behind) and its text equals the shipped server's per-token stream of the same request;
- an `ensemble` stream (the engine channel's frames) has the same text as the shipped server's in
  4 text responses instead of 10;
- a cancelled `llm` stream is still aborted (KV blocks back to 0) within the longer sweep period."""

from __future__ import annotations

import time

import numpy as np
import pytest

from clients import GrpcStream, ensemble_stream, llm_inputs, llm_stream
from metrics_util import is_idle, llm_value, wait_for
from repo_edit import set_config_parameter

pytestmark = pytest.mark.e2e

GREEDY10 = {"temperature": "0", "max_tokens": "10", "ignore_eos": "true"}
PROMPT = "Write a short poem about the sea."


def _interval(repo):
    cfg = repo / "llm" / "config.pbtxt"
    set_config_parameter(cfg, "stream_interval", "4")
    set_config_parameter(cfg, "cancellation_check_period_ms", "300")


@pytest.fixture(scope="module")
def coalesced(triton_server_factory):
    return triton_server_factory(_interval)


def test_llm_stream_sends_one_response_per_interval_with_the_same_text(coalesced, triton_server):
    got = llm_stream(coalesced.grpc_url, PROMPT, sampling_parameters=GREEDY10,
                     return_num_output_tokens=True).raise_for_error()
    ref = llm_stream(triton_server.grpc_url, PROMPT, sampling_parameters=GREEDY10,
                     return_num_output_tokens=True).raise_for_error()
    sizes = [int(a[0]) for a in got.all("num_output_tokens")]
    ref_sizes = [int(a[0]) for a in ref.all("num_output_tokens")]
    assert sum(sizes) == sum(ref_sizes) == 10
    # 1 + 4 + 4 + 1 when the response thread keeps up; a stream that fell behind merges further
    # (coalesce_stream_responses), never splits: every response between the first and the last
    # carries at least the interval
    assert len(sizes) <= 4 and all(n >= 4 for n in sizes[1:-1]), sizes
    assert len(ref_sizes) > 4, ref_sizes  # the shipped default streams (about) every token
    assert got.text == ref.text and got.text


def test_ensemble_stream_has_the_same_text_in_fewer_responses(coalesced, triton_server):
    params = dict(max_tokens=10, min_tokens=10, temperature=0.0, stream=True)
    got = ensemble_stream(coalesced.grpc_url, PROMPT, **params).raise_for_error()
    ref = ensemble_stream(triton_server.grpc_url, PROMPT, **params).raise_for_error()
    assert got.text == ref.text and got.text
    n_got = sum(1 for t in got.texts() if t)
    n_ref = sum(1 for t in ref.texts() if t)
    assert n_got <= 4 < n_ref, (n_got, n_ref)


def test_a_cancelled_stream_is_aborted_within_the_longer_sweep_period(coalesced):
    murl = coalesced.metrics_url
    long = {"temperature": "0", "max_tokens": "4000", "ignore_eos": "true"}
    s = GrpcStream(coalesced.grpc_url, "llm", llm_inputs(PROMPT, True, long))
    try:
        for _ in range(2):
            _, err = s.next(timeout=60)
            assert err is None, err
        wait_for(murl, lambda m: llm_value(m, "llm_num_requests_running") >= 1, timeout=30)
    finally:
        t_cancel = time.monotonic()
        s.cancel()
    _, waited = wait_for(murl, is_idle, timeout=30)
    # one 300 ms sweep period plus an engine step and a scrape; far below the 4000-token request
    assert time.monotonic() - t_cancel < 10, waited
    assert np.isfinite(waited)
