"""stream_interval (delta_buffer.SequenceBuffers, the `llm` parameter; vLLM's and SGLang's name): after a
sequence's first streamed response, one response per N tokens, the rest at its end; and the
config.pbtxt parameters stream_interval / cancellation_check_period_ms, checked at load with an error
naming the parameter. The responder test sends real outputs through the response thread against a
stand-in pb_utils (tests/unit/test_responder.py's) and counts the responses the client gets."""

from __future__ import annotations

import pytest

from paddle_llm_engine.outputs import RequestOutput
from paddle_llm_triton.config_params import serving_options
from paddle_llm_triton.llm.delta_buffer import SequenceBuffers
from test_responder import Sender, make, out, pb  # noqa: F401  (pb: the stand-in pb_utils fixture)


def _tok(i, text=None, seq=0, finished=False):
    return RequestOutput(request_id="r", sequence_index=seq, text=f"t{i} " if text is None else text,
                         token_ids=[i], finished=finished, finish_reason="length" if finished else None)


def _flush_sizes(buf, outs, hold=()):
    sizes = []
    for k, o in enumerate(outs):
        f = buf.add(o, hold=k in hold)
        if f is not None:
            sizes.append(len(f.ids))
    return sizes


@pytest.mark.parametrize("n_tokens, interval, want", [
    (10, 1, [1] * 10),            # the default: one response per token
    (10, 3, [1, 3, 3, 3]),        # first token at once, then every 3, the end with what is left
    (9, 3, [1, 3, 3, 2]),
    (2, 8, [1, 1]),               # ends before the interval: the rest goes with the end
    (1, 8, [1]),
])
def test_streamed_flushes_come_every_interval_tokens_after_the_first(n_tokens, interval, want):
    buf = SequenceBuffers(stream=True, stream_interval=interval)
    outs = [_tok(i) for i in range(n_tokens - 1)] + [_tok(n_tokens - 1, finished=True)]
    assert _flush_sizes(buf, outs) == want


def test_every_token_and_its_text_arrive_once_in_order_whatever_the_interval():
    for interval in (1, 2, 5, 64):
        buf = SequenceBuffers(stream=True, stream_interval=interval)
        got_ids, got_text = [], []
        for i in range(37):
            f = buf.add(_tok(i, finished=i == 36))
            if f is not None:
                got_ids += f.ids
                got_text.append(f.text)
        assert got_ids == list(range(37))
        assert "".join(got_text) == "".join(f"t{i} " for i in range(37))


def test_a_token_without_text_yet_waits_for_text_even_when_the_interval_is_due():
    """Held-back bytes (half a UTF-8 character): no empty response, the count carries over."""
    buf = SequenceBuffers(stream=True, stream_interval=2)
    outs = [_tok(0), _tok(1, text=""), _tok(2, text=""), _tok(3, text="é"), _tok(4, finished=True)]
    assert _flush_sizes(buf, outs) == [1, 3, 1]


def test_hold_and_non_streamed_are_unchanged_by_the_interval():
    buf = SequenceBuffers(stream=True, stream_interval=2)
    # a lagging stream (hold: the next output is already at hand) flushes with that next output
    assert _flush_sizes(buf, [_tok(0), _tok(1), _tok(2), _tok(3, finished=True)], hold={0}) == [2, 2]
    once = SequenceBuffers(stream=False, stream_interval=1)
    assert _flush_sizes(once, [_tok(i, finished=i == 5) for i in range(6)]) == [6]


def test_each_sequence_of_a_request_counts_its_own_tokens():
    buf = SequenceBuffers(stream=True, stream_interval=2)
    seen = {0: [], 1: []}
    for i in range(5):
        for seq in (0, 1):
            f = buf.add(_tok(10 * seq + i, seq=seq, finished=i == 4))
            if f is not None:
                seen[seq].append(f.ids)
    assert seen == {0: [[0], [1, 2], [3, 4]], 1: [[10], [11, 12], [13, 14]]}


def test_an_interval_below_one_is_refused():
    for bad in (0, -1):
        with pytest.raises(ValueError, match="stream_interval"):
            SequenceBuffers(stream=True, stream_interval=bad)


def _cfg(**params):
    return {"parameters": {k: {"string_value": v} for k, v in params.items()}}


def test_serving_parameters_parse_with_defaults_and_errors_naming_the_parameter():
    assert serving_options(_cfg()).stream_interval == 1
    assert serving_options(_cfg()).cancellation_check_period_ms == 100
    assert serving_options(_cfg(stream_interval="")).stream_interval == 1
    assert serving_options(_cfg(stream_interval="4")).stream_interval == 4
    assert serving_options(_cfg(cancellation_check_period_ms="250")).cancellation_check_period_ms == 250
    for name in ("stream_interval", "cancellation_check_period_ms"):
        for bad in ("0", "-3", "two", "1.5"):
            with pytest.raises(ValueError, match=name):
                serving_options(_cfg(**{name: bad}))


def test_the_responder_sends_one_response_per_interval_to_the_client(pb):  # noqa: F811
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, _ = make(pb, coalesce=False, stream_interval=4)
    s = Sender()
    r.register("a", s, ResponseOptions(stream=True, return_num_output_tokens=True))
    for i in range(10):
        r.push(out("a", f"w{i}", [100 + i], n_out=i + 1))
    r.push(out("a", "end", [2], finished=True, reason="length", n_out=11))
    assert s.done.wait(5)
    assert [int(resp.tensors["num_output_tokens"][0]) for resp, _ in s.sent] == [1, 4, 4, 2]
    assert b"".join(resp.tensors["text_output"][0] for resp, _ in s.sent) == \
        b"".join(f"w{i}".encode() for i in range(10)) + b"end"
    assert [flags for _, flags in s.sent] == [0, 0, 0, 1]
    r.shutdown()
