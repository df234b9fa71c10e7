"""The messages of the engine channel between `ensemble` and `llm` (paddle_llm_triton/engine_channel/protocol.py):
the generate frame carries what preprocessing made of a row, an output frame one response of the
client's with TensorRT-LLM's semantics (zeros unless logprobs are asked), perf metrics under
TensorRT-LLM's names, and every frame survives the channel's JSON framing."""

from __future__ import annotations

from paddle_llm_engine.outputs import RequestOutput
from paddle_llm_triton.engine_channel import protocol
from paddle_llm_triton.llm.delta_buffer import Flush
from paddle_llm_triton.engine_channel import wire


def _round_trip(frame: dict) -> dict:
    (back,) = wire.FrameReader().feed(wire.encode(frame))
    return back


def test_generate_request_is_plain_json():
    import numpy as np

    msg = protocol.generate_request(np.array([5, 6, 7], np.int32).tolist(), '{"max_tokens": 3}', 2, True, None,
                                    logprobs=True, perf=False, client_request_id="c1")
    assert _round_trip(msg) == {"type": "generate", "client_request_id": "c1", "prompt_ids": [5, 6, 7],
                                "sampling_parameters": '{"max_tokens": 3}', "n": 2, "stream": True,
                                "prompt_text": None, "logprobs": True, "perf": False, "timeout_s": None,
                                "lora": None}


def test_output_frame_zeros_logprobs_unless_asked_and_names_the_reason_on_the_last():
    out = RequestOutput("r", text="ab", token_ids=[1, 2], logprobs=[(-0.5, []), (-0.25, [])], cumulative_logprob=-0.75,
                        num_prompt_tokens=4, num_output_tokens=2, sequence_index=1)
    flush = Flush("ab", [1, 2], out.logprobs, first=True)
    f = _round_trip(protocol.output_frame(out, flush, logprobs=False, perf=False))
    assert f["logprobs"] == [0.0, 0.0] and f["cum"] == 0.0 and f["finish_reason"] == ""
    assert (f["seq"], f["text"], f["ids"], f["finished"], f["seq_finished"]) == (1, "ab", [1, 2], False, False)
    assert "perf" not in f
    out.finished, out.finish_reason, out.sequence_finished = True, "stop", True
    f = _round_trip(protocol.output_frame(out, flush, logprobs=True, perf=False))
    assert f["logprobs"] == [-0.5, -0.25] and f["cum"] == -0.75
    assert f["finish_reason"] == "stop" and f["finished"] and f["seq_finished"]


def test_perf_metrics_with_tensorrt_llm_names():
    out = RequestOutput("r", arrival_time=10.0, first_scheduled_time=10.25, first_token_time=10.5,
                        last_token_time=11.0, num_new_blocks=2, num_reused_blocks=3)
    d = _round_trip(protocol.output_frame(out, Flush("", [], [], True), logprobs=False, perf=True))["perf"]
    assert [n for n, _ in protocol.PERF_OUTPUTS] == list(d)
    assert d["arrival_time_ns"] == 10_000_000_000 and d["first_scheduled_time_ns"] == 10_250_000_000
    assert d["first_token_time_ns"] == 10_500_000_000 and d["last_token_time_ns"] == 11_000_000_000
    assert (d["kv_cache_reused_blocks"], d["kv_cache_alloc_new_blocks"], d["kv_cache_alloc_total_blocks"]) == (3, 2, 5)
    assert d["acceptance_rate"] == 0.0 and d["total_draft_tokens"] == d["total_accepted_draft_tokens"] == 0
    assert protocol.perf_metrics(RequestOutput("r"))["first_token_time_ns"] == 0


def test_error_frame_keeps_code_and_message():
    assert _round_trip(protocol.error_frame("invalid_arg", "max_tokens: must be >= 1, got 0")) == {
        "type": "error", "code": "invalid_arg", "message": "max_tokens: must be >= 1, got 0"}
    assert protocol.error_frame(None, None) == {"type": "error", "code": "internal", "message": "error"}


def test_merged_output_frames_carry_both_deltas_and_the_later_state():
    from paddle_llm_triton.engine_channel.protocol import merge_output_frames

    a = {"type": "output", "seq": 0, "text": "Hel", "ids": [1, 2], "logprobs": [-0.1, -0.2], "cum": -0.3,
         "finish_reason": "", "seq_finished": False, "finished": False, "num_prompt_tokens": 4,
         "num_output_tokens": 2, "perf": {"arrival_time_ns": 1}}
    b = {"type": "output", "seq": 0, "text": "lo", "ids": [3], "logprobs": [-0.5], "cum": -0.8,
         "finish_reason": "length", "seq_finished": True, "finished": True, "num_prompt_tokens": 4,
         "num_output_tokens": 3, "perf": {"arrival_time_ns": 2}}
    m = merge_output_frames(a, b)
    assert m["text"] == "Hello" and m["ids"] == [1, 2, 3] and m["logprobs"] == [-0.1, -0.2, -0.5]
    assert (m["cum"], m["finish_reason"], m["seq_finished"], m["finished"], m["num_output_tokens"]) == \
        (-0.8, "length", True, True, 3)
    assert m["perf"] == {"arrival_time_ns": 2}
    assert a["text"] == "Hel" and a["ids"] == [1, 2]  # inputs untouched
    assert merge_output_frames(a, {**b, "seq": 1}) is None             # another sequence (n > 1)
    assert merge_output_frames(a, {"type": "error", "code": "internal", "message": "x"}) is None
    assert merge_output_frames({**a, "seq_finished": True}, b) is None  # a ended its sequence


def test_a_row_that_fell_behind_is_relayed_as_one_frame_per_sequence_run():
    from paddle_llm_triton.ensemble.pipeline import EnsemblePipeline

    def out(seq, text, fin=False):
        return {"type": "output", "seq": seq, "text": text, "ids": [len(text)], "logprobs": [0.0], "cum": 0.0,
                "finish_reason": "stop" if fin else "", "seq_finished": fin, "finished": False}

    class Arrived:
        def __init__(self, frames):
            self.frames = list(frames)

        def take_ready(self):
            return self.frames.pop(0) if self.frames else None

    stream = Arrived([out(0, "b"), out(0, "c"), out(1, "x"), out(0, "d")])
    frame, ahead = EnsemblePipeline._coalesce(stream, out(0, "a"))
    assert frame["text"] == "abc" and frame["ids"] == [1, 1, 1] and ahead["seq"] == 1
    assert [f["text"] for f in stream.frames] == ["d"]  # not read ahead past the first that did not merge
    # an ending frame is never merged into: it goes out as it is
    stream = Arrived([out(0, "z")])
    frame, ahead = EnsemblePipeline._coalesce(stream, out(0, "y", fin=True))
    assert frame["text"] == "y" and ahead is None and len(stream.frames) == 1
    # nothing arrived: the frame as it is
    frame, ahead = EnsemblePipeline._coalesce(Arrived([]), out(0, "q"))
    assert frame["text"] == "q" and ahead is None
