"""The main job, end to end against the real tritonserver: the `ensemble` model answers a chat
question by gRPC streaming and by HTTP generate / generate_stream, streamed and non-streamed text
agree, and concurrent greedy streams return what they return alone."""

from __future__ import annotations

import pytest

from clients import ensemble_stream, run_concurrently
from http_clients import http_generate, http_generate_stream

pytestmark = pytest.mark.e2e

QUESTION = "What is the capital of France?"
MAX_TOKENS = 32
GREEDY = dict(apply_chat_template=True, temperature=0.0, max_tokens=MAX_TOKENS)
HTTP_GREEDY = {"text_input": QUESTION, "apply_chat_template": True, "temperature": 0.0, "max_tokens": MAX_TOKENS}


@pytest.fixture(scope="module")
def streamed(triton_server):
    """The greedy streamed answer to QUESTION through gRPC (deltas)."""
    r = ensemble_stream(triton_server.grpc_url, QUESTION, stream=True, **GREEDY).raise_for_error()
    return r.texts()


def test_grpc_stream_answers_paris(streamed):
    assert len(streamed) > 1, f"expected several streamed deltas, got {streamed!r}"
    assert "Paris" in "".join(streamed)


def test_http_generate_stream_answers_paris_and_matches_grpc(triton_server, streamed):
    r = http_generate_stream(triton_server.http_base, "ensemble", dict(HTTP_GREEDY, stream=True))
    assert r.status == 200 and r.error is None, (r.status, r.error)
    deltas = [e["text_output"] for e in r.events]
    assert len(deltas) > 1, f"expected several SSE events, got {r.events!r}"
    assert "Paris" in r.text
    assert r.text == "".join(streamed)


def test_grpc_non_streaming_gives_one_response_equal_to_joined_stream(triton_server, streamed):
    r = ensemble_stream(triton_server.grpc_url, QUESTION, stream=False, exclude_input_in_output=True,
                        **GREEDY).raise_for_error()
    assert len(r.responses) == 1, f"non-streaming must give exactly one response, got {r.texts()!r}"
    assert r.text == "".join(streamed)


def test_http_generate_equals_joined_stream(triton_server, streamed):
    r = http_generate(triton_server.http_base, "ensemble", dict(HTTP_GREEDY, exclude_input_in_output=True))
    assert r.status == 200 and r.error is None, (r.status, r.body)
    assert r.body["text_output"] == "".join(streamed)


@pytest.mark.parametrize("exclude", [False, None], ids=["exclude_false", "exclude_absent"])
def test_non_streamed_text_starts_with_prompt_unless_excluded(triton_server, streamed, exclude):
    """TensorRT-LLM semantics: without exclude_input_in_output=True the prompt text is prepended."""
    answer = "".join(streamed)
    g = ensemble_stream(triton_server.grpc_url, QUESTION, stream=False, exclude_input_in_output=exclude,
                        **GREEDY).raise_for_error()
    assert len(g.responses) == 1
    assert g.text.startswith(QUESTION), g.text
    assert g.text == QUESTION + answer

    payload = dict(HTTP_GREEDY)
    if exclude is not None:
        payload["exclude_input_in_output"] = exclude
    h = http_generate(triton_server.http_base, "ensemble", payload)
    assert h.status == 200, h.body
    assert h.body["text_output"] == QUESTION + answer


PROMPTS = [
    "What is the capital of France?",
    "Name three colors.",
    "What is 2 plus 2?",
    "Who wrote Hamlet?",
    "What is the largest planet?",
    "Give me a synonym for happy.",
    "What language is spoken in Spain?",
    "What do bees make?",
]


def test_eight_concurrent_greedy_streams_match_their_solo_text(triton_server):
    url = triton_server.grpc_url

    def one(prompt):
        return ensemble_stream(url, prompt, stream=True, apply_chat_template=True, temperature=0.0,
                               max_tokens=24).raise_for_error().text

    alone = [one(p) for p in PROMPTS]
    assert all(alone), alone
    assert len(set(alone)) == len(PROMPTS), "eight prompts should give eight different answers"
    together = run_concurrently([lambda p=p: one(p) for p in PROMPTS])
    mismatches = [(p, a, t) for p, a, t in zip(PROMPTS, alone, together) if a != t]
    assert not mismatches, "concurrent text differs from solo text: " + "; ".join(
        f"{p!r}: alone {a!r} vs concurrent {t!r}" for p, a, t in mismatches)
