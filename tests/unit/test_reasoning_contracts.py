"""The thinking budget and the reasoning split through both Triton contracts without a server:
sampling_parameters keys (reasoning_max_tokens / thinking_token_budget: one parameter; both with
different values is an error naming both), the ensemble's tensors and its pipeline JSON, and the
`llm` responder with return_reasoning (text_output without the thinking, reasoning_output with it,
num_reasoning_tokens per response when streaming and for the answer otherwise, coalesced responses
keeping the split) against a stand-in triton_python_backend_utils."""

from __future__ import annotations

import pytest

from test_responder import Sender, make, out, pb  # noqa: F401  (pb: the stand-in fixture)

from paddle_llm_engine import InvalidRequestError
from paddle_llm_triton.contracts import trtllm
from paddle_llm_triton.contracts.vllm import from_request_parameters, from_vllm_json, to_json


@pytest.mark.parametrize("key", ["reasoning_max_tokens", "thinking_token_budget"])
def test_both_budget_names_set_one_parameter(key):
    assert from_vllm_json(f'{{"{key}": 12}}', 1000).reasoning_max_tokens == 12
    assert from_vllm_json(f'{{"{key}": "12"}}').reasoning_max_tokens == 12  # vLLM-backend clients send strings
    p, _ = from_request_parameters({key: "5", "return_reasoning": "true"}, 1000)
    assert p.reasoning_max_tokens == 5
    assert trtllm.from_trtllm_tensors({key: 9}, 1000).reasoning_max_tokens == 9


def test_both_names_with_different_values_is_an_error_naming_both():
    assert from_vllm_json('{"reasoning_max_tokens": 4, "thinking_token_budget": 4}').reasoning_max_tokens == 4
    with pytest.raises(InvalidRequestError) as e:
        from_vllm_json('{"reasoning_max_tokens": 4, "thinking_token_budget": 7}')
    assert e.value.field == "sampling_parameters.reasoning_max_tokens"
    assert "thinking_token_budget (7)" in str(e.value) and "reasoning_max_tokens (4)" in str(e.value)
    with pytest.raises(InvalidRequestError, match="thinking_token_budget") as e:
        trtllm.from_trtllm_tensors({"reasoning_max_tokens": 4, "thinking_token_budget": 7}, 1000)
    assert e.value.field == "reasoning_max_tokens"
    with pytest.raises(InvalidRequestError, match="sampling_parameters.reasoning_max_tokens: must be >= 0"):
        from_vllm_json('{"reasoning_max_tokens": -2}', 1000)
    with pytest.raises(InvalidRequestError, match="^reasoning_max_tokens: must be >= 0"):
        trtllm.from_trtllm_tensors({"reasoning_max_tokens": -2}, 1000)
    with pytest.raises(InvalidRequestError, match="sampling_parameters.reasoning_parser: expected a string"):
        from_vllm_json('{"reasoning_parser": 3}')


def test_the_ensemble_pipeline_json_carries_the_budget_once():
    p = trtllm.from_trtllm_tensors({"thinking_token_budget": 6, "max_tokens": 20}, 1000)
    text = to_json(p)
    assert '"reasoning_max_tokens": 6' in text and "thinking_token_budget" not in text
    assert trtllm.from_pipeline_json(text).reasoning_max_tokens == 6
    assert from_vllm_json(to_json(from_vllm_json('{"reasoning_parser": "none"}'))).reasoning_parser == "none"


def _split_out(rid, raw, reasoning, content, ids, n_reasoning, finished=False, n_out=0):
    o = out(rid, raw, ids, finished=finished, reason="stop" if finished else None, n_out=n_out)
    o.reasoning_text, o.content_text, o.num_reasoning_tokens = reasoning, content, n_reasoning
    return o


STEPS = [  # (raw text, reasoning part, content part, ids, reasoning tokens so far): "<think>a b</think>\n\nok 好"
    ("<think>a", "a", "", [5], 1), (" b</think>", " b", "", [6, 7], 3), ("\n\nok", "", "ok", [8], 3),
    (" 好", "", " 好", [9], 3)]


@pytest.mark.parametrize("stream,coalesce", [(True, False), (True, True), (False, True)])
def test_return_reasoning_splits_text_output_streamed_and_not(pb, stream, coalesce):  # noqa: F811
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, _ = make(pb, coalesce=coalesce)
    s = Sender()
    r.register("a", s, ResponseOptions(stream=stream, return_reasoning=True, return_num_output_tokens=True))
    n = 0
    for i, (raw, rs, c, ids, nr) in enumerate(STEPS):
        n += len(ids)
        r.push(_split_out("a", raw, rs, c, ids, nr, finished=i == len(STEPS) - 1, n_out=n))
    assert s.done.wait(5)
    texts = [resp.tensors["text_output"][0].decode() for resp, _ in s.sent]
    reasoning = [resp.tensors["reasoning_output"][0].decode() for resp, _ in s.sent]
    counts = [int(resp.tensors["num_reasoning_tokens"][0]) for resp, _ in s.sent]
    assert "".join(texts) == "ok 好" and "".join(reasoning) == "a b"
    assert sum(counts) == 3 if stream else counts == [3]
    if stream and not coalesce:
        assert texts == ["", "", "ok", " 好"] and reasoning == ["a", " b", "", ""] and counts == [1, 2, 0, 0]
    r.shutdown()


def test_without_return_reasoning_text_output_is_the_raw_text(pb):  # noqa: F811
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, _ = make(pb, coalesce=False)
    s = Sender()
    r.register("a", s, ResponseOptions(stream=True))
    for i, (raw, rs, c, ids, nr) in enumerate(STEPS):
        r.push(_split_out("a", raw, rs, c, ids, nr, finished=i == len(STEPS) - 1))
    assert s.done.wait(5)
    assert "".join(resp.tensors["text_output"][0].decode() for resp, _ in s.sent) == "<think>a b</think>\n\nok 好"
    assert all("reasoning_output" not in resp.tensors for resp, _ in s.sent)
    r.shutdown()


def test_return_reasoning_on_a_model_without_a_parser_gives_the_whole_text(pb):  # noqa: F811
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, _ = make(pb)
    s = Sender()
    r.register("a", s, ResponseOptions(stream=False, return_reasoning=True, prompt_text="Q: "))
    r.push(out("a", "plain ", [5]))
    r.push(out("a", "answer", [6], finished=True, reason="stop"))
    assert s.done.wait(5)
    (resp, _), = s.sent
    assert resp.tensors["text_output"][0] == b"Q: plain answer" and resp.tensors["reasoning_output"][0] == b""
    assert int(resp.tensors["num_reasoning_tokens"][0]) == 0
    r.shutdown()
