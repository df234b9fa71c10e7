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
