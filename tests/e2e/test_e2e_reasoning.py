"""Thinking models through the real tritonserver: a server of its own on the tiny random Qwen3
thinking checkpoint (tests/support/thinking_checkpoints.py; reasoning_parser auto picks qwen3).

`llm`: the raw text by default (the vLLM backend has no reasoning output); return_reasoning splits it
into text_output (the answer) and reasoning_output (the thinking), streamed and not; the budget under
both names (reasoning_max_tokens, thinking_token_budget) gives exactly N chosen thinking tokens, then
"\\n</think>\\n\\n" (checked on the token ids that return_logprobs reports), with and without guided
decoding; both names with different values are INVALID_ARG naming both. `ensemble`: the budget
inputs, n = 2 (each sequence as `llm` with seed + i), streamed and not. Metrics:
llm_reasoning_tokens_total counts the thinking tokens. The random model never ends its thinking by
itself here: `</think>` is a bad word / biased out, so only the budget ends it."""

from __future__ import annotations

import json

import pytest
import requests

from clients import decode_str, ensemble_stream, llm_stream, scrape_metrics
from metrics_util import llm_value
from repo_edit import copy_repository, set_config_parameter
from thinking_checkpoints import make_thinking_checkpoint

import paddle_llm_launcher as launcher

pytestmark = pytest.mark.e2e

PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"  # Qwen3's turn; thinking on
END_SEQ = [10, 260, 10, 10]  # "\n</think>\n\n" in the tiny Qwen3 tokenizer (byte-level: "\n" is id 10)
THINK_END = 260
ASCII = [10] + list(range(32, 127))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reasoning_e2e")
    model_dir = make_thinking_checkpoint("qwen3", tmp / "qwen3")

    def edit(repo):
        set_config_parameter(repo / "llm" / "config.pbtxt", "num_kv_blocks", "256")
        set_config_parameter(repo / "llm" / "config.pbtxt", "block_size", "16")

    repo = copy_repository(tmp / "repo", None, edit)
    log = tmp / "tritonserver.log"
    http, grpc, metrics = launcher.free_ports(3)
    handle = launcher.start_server(repo, http, grpc, metrics, model_dir=str(model_dir), log_path=log)
    try:
        handle.wait_ready(timeout=180)
    except (RuntimeError, TimeoutError) as e:
        handle.stop()
        pytest.fail(f"tritonserver did not start: {e}\n{handle.log_tail(60)}", pytrace=False)
    try:
        yield {"grpc": f"127.0.0.1:{grpc}", "http": f"http://127.0.0.1:{http}", "metrics": f"http://127.0.0.1:{metrics}/metrics", "log": log,
               "model_dir": model_dir}
    finally:
        handle.stop()


def _sp(budget_key="reasoning_max_tokens", budget=5, **kw):
    sp = {"temperature": 0, "max_tokens": 20, "ignore_eos": True, budget_key: budget,
          "logit_bias": {str(THINK_END): -100}, "allowed_token_ids": ASCII + [THINK_END]}
    sp.update(kw)
    return json.dumps(sp)


def _ids(res) -> list[int]:
    """The sampled token ids, from the logprob entries (the sampled token is each entry's first key)."""
    ids = []
    for arr in res.all("logprobs"):
        for entry in json.loads(arr.reshape(-1)[0]):
            ids.append(int(next(iter(entry))))
    return ids


def _joined(res, name) -> str:
    return "".join(decode_str(r, name) for r in res.responses if r.as_numpy(name) is not None)


def test_the_log_names_the_parser_once(server):
    lines = [ln for ln in server["log"].read_text(errors="replace").splitlines() if "reasoning parser:" in ln]
    assert len(lines) == 1 and "reasoning parser: qwen3 (auto: model_type qwen3" in lines[0], lines


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("budget_key", ["reasoning_max_tokens", "thinking_token_budget"])
def test_llm_return_reasoning_splits_and_the_budget_is_exact(server, stream, budget_key):
    from paddle_llm_engine.tokenizer import load_tokenizer

    tok = load_tokenizer(str(server["model_dir"]))
    res = llm_stream(server["grpc"], PROMPT, stream=stream, sampling_parameters=_sp(budget_key, 5, logprobs=0),
                     return_reasoning=True, return_logprobs=True, exclude_input_in_output=True).raise_for_error()
    ids = _ids(res)
    assert len(ids) == 20 and THINK_END not in ids[:5] and ids[5:9] == END_SEQ
    reasoning, answer = _joined(res, "reasoning_output"), _joined(res, "text_output")
    assert reasoning == tok.decode(ids[:5]) + "\n"
    assert answer == tok.decode(ids[9:]).lstrip() and "</think>" not in answer
    counts = [int(a.reshape(-1)[0]) for a in res.all("num_reasoning_tokens")]
    assert sum(counts) == 7 if stream else counts == [7]  # 5 chosen + "\n" + "</think>"
    raw = llm_stream(server["grpc"], PROMPT, stream=stream, sampling_parameters=_sp(budget_key, 5),
                     exclude_input_in_output=True).raise_for_error()
    assert raw.text == tok.decode(ids)  # without return_reasoning: the raw text, markers and all
    assert all(r.as_numpy("reasoning_output") is None for r in raw.responses)


def test_guided_json_starts_after_the_thinking(server):
    guide = {"json": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                      "required": ["a"], "additionalProperties": False}, "disable_any_whitespace": True}
    sp = json.dumps({"temperature": 0, "max_tokens": 30, "reasoning_max_tokens": 4, "logprobs": 0,
                     "logit_bias": {str(THINK_END): -100}, "structured_outputs": guide})
    for stream in (True, False):
        res = llm_stream(server["grpc"], PROMPT, stream=stream, sampling_parameters=sp, return_reasoning=True,
                         return_logprobs=True, return_finish_reason=True,
                         exclude_input_in_output=True).raise_for_error()
        ids = _ids(res)
        assert ids[4:8] == END_SEQ
        value = json.loads(_joined(res, "text_output"))
        assert list(value) == ["a"] and 0 <= value["a"] <= 9
        assert decode_str(res.responses[-1], "finish_reason") == "stop"


def test_both_budget_names_with_different_values_is_invalid_arg(server):
    sp = '{"reasoning_max_tokens": 3, "thinking_token_budget": 4}'
    res = llm_stream(server["grpc"], PROMPT, stream=True, sampling_parameters=sp)
    assert res.error is not None and not res.responses
    msg = res.error.message()
    assert msg.startswith("sampling_parameters.reasoning_max_tokens:") and "thinking_token_budget (4)" in msg
    h = requests.post(f"{server['http']}/v2/models/llm/generate", timeout=60,
                      json={"text_input": "Hello", "sampling_parameters": sp})
    assert h.status_code == 400 and "thinking_token_budget (4)" in h.json()["error"], h.text  # 400 = INVALID_ARG
    res = ensemble_stream(server["grpc"], "hi", max_tokens=4, reasoning_max_tokens=3, thinking_token_budget=4)
    assert res.error is not None and "reasoning_max_tokens" in res.error.message()
    assert "thinking_token_budget (4)" in res.error.message()


@pytest.mark.parametrize("stream", [True, False])
def test_ensemble_budget_with_two_sequences(server, stream):
    common = dict(max_tokens=16, bad_words=["</think>"], stream=stream, exclude_input_in_output=True)
    res = ensemble_stream(server["grpc"], PROMPT, reasoning_max_tokens=3, num_return_sequences=2, top_k=20,
                          temperature=1.0, seed=11, **common).raise_for_error()
    texts = {0: "", 1: ""}
    for r in res.responses:
        idx = r.as_numpy("sequence_index")
        texts[int(idx.reshape(-1)[0]) if idx is not None else 0] += decode_str(r, "text_output")
    for i in (0, 1):
        want = llm_stream(server["grpc"], PROMPT, stream=False, exclude_input_in_output=True, sampling_parameters=json.dumps(
            {"max_tokens": 16, "bad_words": ["</think>"], "reasoning_max_tokens": 3, "top_k": 20, "temperature": 1.0,
             "seed": 11 + i})).raise_for_error().text
        assert texts[i] == want
        assert texts[i].count("</think>") == 1 and "\n</think>\n\n" in texts[i]


def _settled_reasoning_tokens(metrics_url: str, quiet_s: float = 2.0, timeout: float = 30.0) -> float:
    """llm_reasoning_tokens_total once it stayed unchanged for quiet_s (the earlier tests' requests
    may still be on their way into the metrics)."""
    import time

    value, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = llm_value(scrape_metrics(metrics_url), "llm_reasoning_tokens_total")
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.1)
    return value


def test_metrics_count_the_reasoning_tokens(server):
    before = _settled_reasoning_tokens(server["metrics"])
    llm_stream(server["grpc"], PROMPT, stream=False, sampling_parameters=_sp(budget=6)).raise_for_error()
    import time

    # the metrics thread may publish the count in more than one update: wait for all of it (a busy
    # host took longer than 5 s once), then check nothing more arrives
    deadline = time.monotonic() + 30
    after = before
    while after - before < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
        after = llm_value(scrape_metrics(server["metrics"]), "llm_reasoning_tokens_total")
    time.sleep(0.5)
    after = llm_value(scrape_metrics(server["metrics"]), "llm_reasoning_tokens_total")
    assert after - before == 8  # 6 chosen + "\n" + "</think>"
