"""The ensemble's engine requests as an llm instance serves them (paddle_llm_triton/llm/ensemble_steps.py),
on a tiny random Llama behind a real EngineLoop: the frames of a request carry exactly the engine's
own greedy tokens and text, per sequence for n = 2, streamed or not (with the prompt prepended only
where asked); logprobs are zeros unless asked and then the engine's; an abort ends the request with
finish_reason "abort" and frees its KV blocks; a malformed frame is refused as invalid_arg, a dead
engine as unavailable."""

from __future__ import annotations

import json
import queue
import threading

import pytest

from paddle_llm_engine import EngineLoop
from paddle_llm_triton.llm.ensemble_steps import EnsembleStepHandler, RefusedRequest
from test_engine_tiny import greedy, make_engine, prompt, run

TIMEOUT = 60.0


class Collector:
    """emit() target: frames in order, and an event at the final one."""

    def __init__(self):
        self.frames: list[dict] = []
        self.done = threading.Event()

    def __call__(self, frame, final):
        self.frames.append(frame)
        if final:
            self.done.set()


@pytest.fixture
def served(tiny_model_dir):
    eng = make_engine(tiny_model_dir)
    loop = EngineLoop(eng)
    outputs = queue.SimpleQueue()
    handler = EnsembleStepHandler(loop, outputs.put, default_max_tokens=0, max_model_len=eng.config.max_model_len,
                                  instance="llm_0_0")
    yield eng, loop, handler, outputs
    loop.shutdown(5)


def generate(handler, ids, sp: dict, **kw) -> Collector:
    c = Collector()
    msg = {"type": "generate", "prompt_ids": ids, "sampling_parameters": json.dumps(sp), "n": 1, "stream": False,
           "prompt_text": None, "logprobs": False, "perf": False}
    msg.update(kw)
    handler.start(msg, c)
    assert c.done.wait(TIMEOUT)
    return c


def test_frames_carry_the_engines_own_tokens_streamed_and_not(served, tiny_model_dir):
    eng, loop, handler, metrics = served
    ids = prompt(7, 1)
    sp = {"temperature": 0, "ignore_eos": True, "max_tokens": 6}
    ref = run(make_engine(tiny_model_dir), {"a": (ids, greedy(6))})["a"]
    plain = generate(handler, ids, sp)
    assert len(plain.frames) == 1  # non-streamed: one response per sequence
    f = plain.frames[0]
    assert f["ids"] == ref["tokens"] and f["text"] == ref["text"] and f["finish_reason"] == "length"
    assert f["finished"] and f["seq_finished"] and f["num_output_tokens"] == 6 and f["num_prompt_tokens"] == 7
    assert f["logprobs"] == [0.0] * 6 and f["cum"] == 0.0
    streamed = generate(handler, ids, sp, stream=True)
    assert sum((g["ids"] for g in streamed.frames), []) == ref["tokens"]
    assert "".join(g["text"] for g in streamed.frames) == ref["text"]
    assert [g["finished"] for g in streamed.frames].count(True) == 1 and streamed.frames[-1]["finished"]
    with_prompt = generate(handler, ids, sp, prompt_text="PROMPT ")
    assert with_prompt.frames[0]["text"] == "PROMPT " + ref["text"]
    assert not metrics.empty()  # every output also went to the metrics hook


def test_n_sequences_and_logprobs_when_asked(served, tiny_model_dir):
    _, _, handler, _ = served
    ids = prompt(5, 2)
    sp = {"temperature": 0, "ignore_eos": True, "max_tokens": 4}
    ref = run(make_engine(tiny_model_dir), {"a": (ids, greedy(4))})["a"]
    c = generate(handler, ids, sp, n=2, logprobs=True)
    by_seq = {f["seq"]: f for f in c.frames}
    assert sorted(by_seq) == [0, 1] and all(f["ids"] == ref["tokens"] for f in by_seq.values())  # greedy: equal
    assert sum(f["finished"] for f in c.frames) == 1 and c.frames[-1]["finished"]
    for f in by_seq.values():
        assert len(f["logprobs"]) == 4 and all(lp < 0 for lp in f["logprobs"])
        assert f["cum"] == pytest.approx(sum(f["logprobs"]), abs=1e-4)


def test_abort_ends_with_abort_and_frees_the_kv_blocks(served):
    eng, loop, handler, _ = served
    c = Collector()
    rid = handler.start({"type": "generate", "prompt_ids": prompt(9, 3), "stream": True,
                         "sampling_parameters": json.dumps({"temperature": 0, "ignore_eos": True, "max_tokens": 100})}, c)
    while not c.frames and not c.done.wait(0.01):
        pass
    handler.abort(rid)
    assert c.done.wait(TIMEOUT), c.frames
    assert c.frames[-1].get("finish_reason") == "abort" and c.frames[-1].get("finished"), c.frames[-1]
    assert sum(len(f["ids"]) for f in c.frames) < 100
    loop.shutdown(5)  # the engine thread is idle: its blocks are all back
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


@pytest.mark.parametrize("msg, what", [
    ({"type": "generate"}, "prompt_ids"),
    ({"type": "generate", "prompt_ids": []}, "input_ids"),
    ({"type": "generate", "prompt_ids": ["a"]}, "input_ids"),
    ({"type": "generate", "prompt_ids": [1], "sampling_parameters": "{bad"}, "sampling_parameters"),
])
def test_malformed_frames_are_refused_as_invalid_arg(served, msg, what):
    _, _, handler, _ = served
    with pytest.raises(RefusedRequest) as e:
        handler.start(msg, Collector())
    assert e.value.channel_code == "invalid_arg" and what in str(e.value)


def test_a_request_past_the_engine_limits_is_an_error_frame(served):
    eng, _, handler, _ = served
    c = generate(handler, prompt(5, 4), {"max_tokens": eng.config.max_model_len})
    assert [f["type"] for f in c.frames] == ["error"] and c.frames[0]["code"] == "invalid_arg"
    assert "max_tokens" in c.frames[0]["message"]


def test_a_dead_engine_is_refused_as_unavailable(served):
    _, loop, handler, _ = served
    loop.shutdown(5)
    with pytest.raises(RefusedRequest) as e:
        handler.start({"type": "generate", "prompt_ids": [5, 6]}, Collector())
    assert e.value.channel_code == "unavailable" and "llm instance llm_0_0 is not serving" in str(e.value)


def test_trtllm_lora_task_runs_with_the_weights_it_was_sent(tiny_model_dir, tmp_path):
    """TensorRT-LLM's lora_task_id + lora_weights + lora_config on the llm side (llm/lora_tasks.py):
    the greedy tokens are those of the engine on the base checkpoint with the same FP16 adapter
    merged in (tests/support/trtllm_lora_tensors.py: tensors built by hand from TensorRT-LLM's
    layout); a second request by task id alone gives them again; an unknown id is refused with
    TensorRT-LLM's message and the instance keeps serving; with LoRA off the input is named."""
    from lora_adapters import make_adapter, merge_adapter
    from paddle_llm_triton.engine_channel import protocol
    from paddle_llm_triton.llm.lora_tasks import LoraTasks
    from trtllm_lora_tensors import fp16_adapter, hand_tensors

    ad = make_adapter(tiny_model_dir, tmp_path / "ad", seed=11, r=4, alpha=8.0, magnitude=3.0)
    w, c = hand_tensors(ad)
    ids, n = prompt(9, 3), 8
    merged = merge_adapter(tiny_model_dir, fp16_adapter(ad, tmp_path / "ad16"), tmp_path / "merged")
    ref = run(make_engine(str(merged)), {"a": (ids, greedy(n))})["a"]["tokens"]
    base = run(make_engine(tiny_model_dir), {"a": (ids, greedy(n))})["a"]["tokens"]
    assert ref != base  # the adapter changes the output
    eng = make_engine(tiny_model_dir, enable_lora=1, max_lora_rank=8)
    loop = EngineLoop(eng)
    tasks = LoraTasks(eng, 1 << 30, root=str(tmp_path))
    handler = EnsembleStepHandler(loop, lambda out: None, 0, eng.config.max_model_len, "llm_0_0", lora_tasks=tasks)
    sp = {"temperature": 0, "ignore_eos": True, "max_tokens": n}
    try:
        lora = {"task_id": 42, "weights": protocol.encode_array(w), "config": protocol.encode_array(c)}
        assert generate(handler, ids, sp, lora=lora).frames[-1]["ids"] == ref
        assert generate(handler, ids, sp, lora={"task_id": 42}).frames[-1]["ids"] == ref
        assert generate(handler, ids, sp).frames[-1]["ids"] == base
        unknown = generate(handler, ids, sp, lora={"task_id": 43}).frames
        assert unknown == [{"type": "error", "code": "invalid_arg", "message":
                            "lora_task_id: LoRA task 43 not found in cache. Please send LoRA weights with request"}]
        assert generate(handler, ids, sp, lora={"task_id": 42}).frames[-1]["ids"] == ref
        assert [a.name for a in eng.list_loras()] == ["trtllm-task-42"]
        assert tasks._tasks[42].users == 0  # every request released its task
    finally:
        loop.shutdown(5)
        tasks.close()
    off = EnsembleStepHandler(EngineLoop(make_engine(tiny_model_dir)), lambda out: None, 0, 256, "llm_0_1")
    try:
        frames = generate(off, ids, sp, lora={"task_id": 42}).frames
        assert frames[0]["code"] == "invalid_arg" and frames[0]["message"].startswith("lora_task_id: this model "
                                                                                      "serves no LoRA adapters")
    finally:
        off.loop.shutdown(5)
