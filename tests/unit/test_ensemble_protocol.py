"""The `error` output of the internal ensemble protocol (paddle_llm_triton/ensemble_protocol.py)
survives the trip from llm's responder to the ensemble pipeline."""

from __future__ import annotations

from paddle_llm_triton import ensemble_protocol as protocol


def test_error_output_round_trip():
    raw = protocol.encode_error("invalid_arg", "max_tokens: must be >= 1, got 0")
    assert protocol.decode_error(raw) == ("max_tokens: must be >= 1, got 0", "invalid_arg")
    assert protocol.decode_error(raw.decode()) == ("max_tokens: must be >= 1, got 0", "invalid_arg")
    assert protocol.decode_error(protocol.encode_error(None, None)) == ("error", None)


def test_malformed_error_output_is_its_own_message():
    assert protocol.decode_error(b"not json") == ("not json", None)
    assert protocol.decode_error("[1, 2]") == ("[1, 2]", None)


def test_the_pipeline_asks_for_the_error_output():
    assert protocol.ERROR in protocol.LLM_OUTPUTS


def test_perf_metrics_round_trip_with_tensorrt_llm_names():
    from paddle_llm_engine.outputs import RequestOutput

    out = RequestOutput("r", arrival_time=10.0, first_scheduled_time=10.25, first_token_time=10.5,
                        last_token_time=11.0, num_new_blocks=2, num_reused_blocks=3)
    d = protocol.decode_perf_metrics(protocol.encode_perf_metrics(out))
    assert [n for n, _ in protocol.PERF_OUTPUTS] == list(d)
    assert d["arrival_time_ns"] == 10_000_000_000 and d["first_scheduled_time_ns"] == 10_250_000_000
    assert d["first_token_time_ns"] == 10_500_000_000 and d["last_token_time_ns"] == 11_000_000_000
    assert (d["kv_cache_reused_blocks"], d["kv_cache_alloc_new_blocks"], d["kv_cache_alloc_total_blocks"]) == (3, 2, 5)
    assert d["acceptance_rate"] == 0.0 and d["total_draft_tokens"] == d["total_accepted_draft_tokens"] == 0
    assert protocol.decode_perf_metrics(b"junk")["kv_cache_reused_blocks"] == 0
    assert protocol.decode_perf_metrics(protocol.encode_perf_metrics(RequestOutput("r")))["first_token_time_ns"] == 0
