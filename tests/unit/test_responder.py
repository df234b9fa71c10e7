"""The llm model's response thread (paddle_llm_triton/llm/responder.py) against a stand-in
triton_python_backend_utils: vLLM's additional-outputs semantics (intermediate finish_reason "None",
"rank" on every logprob entry, JSON null logprobs when none were asked, decoded_token following
skip_special_tokens) and the cancellation sweep (every request in flight, streamed or not, sent
anything or not; one is_cancelled() per request per sweep, not per token)."""

from __future__ import annotations

import json
import sys
import threading
import time
import types

import numpy as np
import pytest

from paddle_llm_engine.outputs import RequestOutput
from paddle_llm_engine.sampler import TopLogprobs


@pytest.fixture
def pb(monkeypatch):
    m = types.ModuleType("triton_python_backend_utils")
    m.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class Tensor:
        def __init__(self, name, arr):
            self._name, self._arr = name, arr

        def name(self):
            return self._name

        def as_numpy(self):
            return self._arr

    class InferenceResponse:
        def __init__(self, output_tensors=(), error=None):
            self.tensors = {t.name(): t.as_numpy() for t in output_tensors}
            self.error = error

    class TritonError:
        INVALID_ARG, UNAVAILABLE, INTERNAL, CANCELLED = 1, 2, 3, 4

        def __init__(self, message, code=3):
            self.message, self.code = message, code

    m.Tensor, m.InferenceResponse, m.TritonError = Tensor, InferenceResponse, TritonError
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", m)
    return m


class Sender:
    def __init__(self):
        self.sent = []  # (response or None, flags)
        self.cancelled = False
        self.polls = 0
        self.done = threading.Event()

    def send(self, resp, flags=0):
        self.sent.append((resp, flags))
        if flags:
            self.done.set()

    def is_cancelled(self):
        assert not self.done.is_set(), "is_cancelled() after the final response (crashed Triton 2.51)"
        self.polls += 1
        return self.cancelled


class Tok:
    """decode_token stand-in: id 2 is the special EOS "<eos>"; others "t<id>"."""

    def __call__(self, tok, skip):
        return "" if tok == 2 and skip else ("<eos>" if tok == 2 else f"t{tok}")


def out(rid, text, ids, finished=False, reason=None, lps=None, n_out=0):
    return RequestOutput(request_id=rid, text=text, token_ids=ids, finished=finished,
                         finish_reason=reason if finished else None, num_prompt_tokens=3,
                         num_output_tokens=n_out, logprobs=lps or [(-0.5, TopLogprobs([], rank=1))] * len(ids),
                         cumulative_logprob=-0.5 * n_out)


def make(pb, poll_s=0.05, coalesce=True, stream_interval=1):
    from paddle_llm_triton.llm.responder import Responder

    aborted = []
    return Responder(abort=aborted.append, decode_token=Tok(), poll_s=poll_s, coalesce=coalesce,
                     stream_interval=stream_interval), aborted


def wait(pred, timeout=5.0):
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, "condition not met"
        time.sleep(0.005)


def test_stream_intermediate_finish_reason_is_None_and_last_is_the_reason(pb):
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, _ = make(pb, coalesce=False)
    s = Sender()
    r.register("a", s, ResponseOptions(stream=True, return_finish_reason=True))
    for i in range(3):
        r.push(out("a", f"w{i} ", [10 + i], n_out=i + 1))
    r.push(out("a", "end", [2], finished=True, reason="length", n_out=4))
    assert s.done.wait(5)
    reasons = [resp.tensors["finish_reason"][0] for resp, _ in s.sent]
    assert reasons == [b"None", b"None", b"None", b"length"]
    r.shutdown()


def test_logprob_entries_carry_rank_and_decoded_token_follows_skip_special_tokens(pb):
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, _ = make(pb)
    lps = [(-0.1, TopLogprobs([(10, -0.1), (11, -2.0)], rank=1)),   # sampled = top-1
           (-3.0, TopLogprobs([(12, -0.2), (13, -1.0)], rank=7)),   # sampled outside the top 2
           (-0.3, TopLogprobs([], rank=1))]                          # EOS, logprobs=0
    for skip, eos_text in ((True, ""), (False, "<eos>")):
        s = Sender()
        r.register("a", s, ResponseOptions(return_logprobs=True, skip_special_tokens=skip))
        r.push(out("a", "t10t20", [10, 20, 2], finished=True, reason="stop", lps=lps, n_out=3))
        assert s.done.wait(5)
        entries = json.loads(s.sent[0][0].tensors["logprobs"][0])
        assert [list(e) for e in entries] == [["10", "11"], ["20", "12", "13"], ["2"]]
        assert entries[0]["10"] == {"logprob": -0.1, "rank": 1, "decoded_token": "t10"}
        assert entries[0]["11"]["rank"] == 2
        assert entries[1]["20"]["rank"] == 7 and [entries[1][k]["rank"] for k in ("12", "13")] == [1, 2]
        assert entries[2]["2"] == {"logprob": -0.3, "rank": 1, "decoded_token": eos_text}
        assert all(set(v) == {"logprob", "rank", "decoded_token"} for e in entries for v in e.values())
    r.shutdown()


def test_return_logprobs_without_logprobs_asked_is_json_null(pb):
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, _ = make(pb, coalesce=False)
    s = Sender()
    r.register("a", s, ResponseOptions(stream=True, return_logprobs=True, logprobs_null=True))
    r.push(out("a", "x", [10], n_out=1))
    r.push(out("a", "y", [11], finished=True, reason="length", n_out=2))
    assert s.done.wait(5)
    assert [json.loads(resp.tensors["logprobs"][0]) for resp, _ in s.sent] == [None, None]
    r.shutdown()


def test_cancellation_is_seen_before_any_response_and_aborts(pb):
    """A non-streamed request has sent nothing while it generates: the sweep still polls it."""
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, aborted = make(pb)
    quiet, other = Sender(), Sender()
    r.register("quiet", quiet, ResponseOptions(stream=False))
    r.register("other", other, ResponseOptions(stream=True))
    wait(lambda: quiet.polls >= 2)
    assert not aborted
    t0 = time.monotonic()
    quiet.cancelled = True
    wait(lambda: aborted == ["quiet"])
    assert time.monotonic() - t0 < 0.5
    r.push(out("quiet", "", [], finished=True, reason="abort"))  # the engine's final output of the abort
    assert quiet.done.wait(5)
    assert quiet.sent == [(None, 1)]  # only the empty final response
    r.shutdown()


def test_sweep_polls_each_request_once_per_period_not_per_output(pb):
    from paddle_llm_triton.llm.responder import ResponseOptions

    for coalesce in (False, True):
        r, _ = make(pb, poll_s=0.1, coalesce=coalesce)
        s = Sender()
        r.register("a", s, ResponseOptions(stream=True, return_num_output_tokens=True))
        t0 = time.monotonic()
        for i in range(2000):  # a busy stream: many outputs per sweep period
            r.push(out("a", "x", [10], n_out=i + 1))
        r.push(out("a", "y", [11], finished=True, reason="length", n_out=2001))
        assert s.done.wait(30)
        elapsed = time.monotonic() - t0
        if not coalesce:
            assert len(s.sent) == 2001
        # every token arrives once, in order, whatever the number of responses
        assert b"".join(resp.tensors["text_output"][0] for resp, _ in s.sent) == b"x" * 2000 + b"y"
        assert sum(int(resp.tensors["num_output_tokens"][0]) for resp, _ in s.sent) == 2001
        assert s.polls <= elapsed / 0.1 + 2, f"{s.polls} is_cancelled() calls in {elapsed:.2f} s"
        r.shutdown()


class BlockingSender(Sender):
    """Its first send waits for `release`: the outputs pushed meanwhile queue up behind it."""

    def __init__(self):
        super().__init__()
        self.release, self.started = threading.Event(), threading.Event()

    def send(self, resp, flags=0):
        if not self.sent:
            self.started.set()
            assert self.release.wait(10)
        super().send(resp, flags)


def test_a_stream_that_fell_behind_gets_its_queued_tokens_in_one_response(pb):
    from paddle_llm_triton.llm.responder import ResponseOptions

    for coalesce, expect in ((True, [b"w0 ", b"w1 w2 end"]), (False, [b"w0 ", b"w1 ", b"w2 ", b"end"])):
        r, _ = make(pb, coalesce=coalesce)
        a, b = BlockingSender(), Sender()
        opts = dict(stream=True, return_finish_reason=True, return_num_output_tokens=True, return_logprobs=True)
        r.register("a", a, ResponseOptions(**opts))
        r.register("b", b, ResponseOptions(**opts))
        r.push(out("a", "w0 ", [10], n_out=1))
        assert a.started.wait(5)  # the thread is inside a's first send; the rest queues
        for i in (1, 2):
            r.push(out("a", f"w{i} ", [10 + i], n_out=i + 1))
            r.push(out("b", f"v{i} ", [20 + i], n_out=i))
        r.push(out("a", "end", [2], finished=True, reason="length", n_out=4))
        r.push(out("b", "", [], finished=True, reason="abort"))
        a.release.set()
        assert a.done.wait(5) and b.done.wait(5)
        assert [resp.tensors["text_output"][0] for resp, _ in a.sent] == expect
        counts = [int(resp.tensors["num_output_tokens"][0]) for resp, _ in a.sent]
        assert counts == ([1, 3] if coalesce else [1, 1, 1, 1])
        # logprob entries follow the tokens of each response; the finish reason is the last output's
        assert [len(json.loads(resp.tensors["logprobs"][0])) for resp, _ in a.sent] == counts
        assert [resp.tensors["finish_reason"][0] for resp, _ in a.sent][-1] == b"length"
        assert [f for _, f in a.sent][-1] == 1 and all(f == 0 for _, f in a.sent[:-1])
        # the other request's text is not merged into a's, and its end still ends it
        text_b = b"".join(resp.tensors["text_output"][0] for resp, _ in b.sent if resp is not None)
        assert text_b == b"v1 v2 " and b.sent[-1][1] == 1
        r.shutdown()


def test_an_error_after_queued_text_sends_the_text_first(pb):
    from paddle_llm_triton.llm.responder import ResponseOptions

    r, _ = make(pb)
    a = BlockingSender()
    r.register("a", a, ResponseOptions(stream=True))
    r.push(out("a", "w0 ", [10], n_out=1))
    assert a.started.wait(5)
    r.push(out("a", "w1 ", [11], n_out=2))
    err = out("a", "", [], finished=True, reason="error")
    err.error, err.error_code = "engine failed", "internal"
    r.push(err)
    a.release.set()
    assert a.done.wait(5)
    assert [resp.tensors["text_output"][0] for resp, _ in a.sent[:2]] == [b"w0 ", b"w1 "]
    assert a.sent[2][0].error.message == "engine failed" and a.sent[2][1] == 1
    r.shutdown()


def seq_out(rid, i, text, ids, seq_finished=False, finished=False, reason=None, n_out=0, cum=0.0):
    return RequestOutput(request_id=rid, text=text, token_ids=ids, finished=finished,
                         finish_reason=reason if seq_finished else None, num_prompt_tokens=3,
                         num_output_tokens=n_out, logprobs=[(-0.5, TopLogprobs([], rank=1))] * len(ids),
                         cumulative_logprob=cum, sequence_index=i, sequence_finished=seq_finished,
                         num_sequences=2)


def test_n_2_non_streamed_is_one_response_with_both_answers_as_the_vllm_backend_sends(pb):
    from paddle_llm_triton.llm.vllm_request import ResponseOptions

    r, _ = make(pb)
    s = Sender()
    r.register("n2", s, ResponseOptions(stream=False, prompt_text="P:", return_finish_reason=True,
                                        return_num_output_tokens=True, return_cumulative_logprob=True,
                                        return_num_input_tokens=True, n=2))
    r.push(seq_out("n2", 0, "a", [5]))
    r.push(seq_out("n2", 1, "x", [7]))
    r.push(seq_out("n2", 1, "y", [8], seq_finished=True, reason="stop", n_out=2, cum=-1.5))
    r.push(seq_out("n2", 0, "b", [6], seq_finished=True, finished=True, reason="length", n_out=2, cum=-0.25))
    assert s.done.wait(5)
    r.shutdown()
    assert len(s.sent) == 1 and s.sent[0][1] == 1  # exactly one response, FINAL (HTTP generate takes one)
    t = s.sent[0][0].tensors
    assert t["text_output"].tolist() == [b"P:ab", b"P:xy"]  # entry i: sequence i, each with the prompt
    assert t["finish_reason"].tolist() == [b"length", b"stop"]
    assert t["num_output_tokens"].tolist() == [2, 2] and t["num_input_tokens"].tolist() == [3]
    assert t["cumulative_logprob"].tolist() == [-0.25, -1.5]


def test_n_2_streamed_sends_each_sequence_delta_at_its_own_index(pb):
    from paddle_llm_triton.llm.vllm_request import ResponseOptions

    r, _ = make(pb, coalesce=False)
    s = Sender()
    r.register("s2", s, ResponseOptions(stream=True, return_finish_reason=True, n=2))
    r.push(seq_out("s2", 0, "a", [5]))
    r.push(seq_out("s2", 1, "x", [7], seq_finished=True, reason="stop", n_out=1))
    r.push(seq_out("s2", 0, "b", [6], seq_finished=True, finished=True, reason="length", n_out=2))
    assert s.done.wait(5)
    r.shutdown()
    texts = [resp.tensors["text_output"].tolist() for resp, _ in s.sent]
    reasons = [resp.tensors["finish_reason"].tolist() for resp, _ in s.sent]
    assert texts == [[b"a", b""], [b"", b"x"], [b"b", b""]]
    assert reasons == [[b"None", b"None"], [b"None", b"stop"], [b"length", b"None"]]
    assert [f for _, f in s.sent] == [0, 0, 1]
    # concatenated per index, the client has each sequence's whole text
    assert ["".join(x[i].decode() for x in texts) for i in range(2)] == ["ab", "x"]
