"""OpenAI edges found by OpenAI clients and Triton's own OpenAI tests, against the real server:
OpenAI's ranges (temperature above 2, completions logprobs above 5: 400 naming the parameter), vLLM's
/tokenize and /detokenize (counts equal to what `llm` itself counts, round trips, named errors), and a
frontend whose Triton is not ready (503 `model_not_ready` on every /v1 route, no internal address
or raw gRPC error in any answer)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

import paddle_llm_launcher as launcher
from paddle_llm_launcher.frontend import start_frontend

pytestmark = pytest.mark.e2e

CHAT = [{"role": "user", "content": "Name three colours, in French: \u00e9\u00e8 \u4f60\u597d"}]


def _post(base, path, body):
    return requests.post(f"{base}{path}", json=body, timeout=120)


def _error(r, status, param):
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["param"] == param, err
    return err


@pytest.mark.parametrize("value, ok", [(2.0, True), (2.01, False), (-0.1, False)])
def test_temperature_outside_openais_range_is_400(openai_server, value, ok):
    for path, extra in (("/v1/chat/completions", {"messages": CHAT}), ("/v1/completions", {"prompt": "Hi"})):
        r = _post(openai_server.base, path, {"model": "llm", "max_tokens": 2, "temperature": value, **extra})
        if ok:
            assert r.status_code == 200, r.text
        else:
            assert "between 0 and 2" in _error(r, 400, "temperature")["message"]


def test_completions_logprobs_above_5_is_400(openai_server):
    body = {"model": "llm", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    r = _post(openai_server.base, "/v1/completions", dict(body, logprobs=5))
    assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["top_logprobs"][0]) == 5, r.text
    assert "between 0 and 5" in _error(_post(openai_server.base, "/v1/completions", dict(body, logprobs=6)),
                                       400, "logprobs")["message"]
    # chat keeps OpenAI's 20 for top_logprobs
    r = _post(openai_server.base, "/v1/chat/completions", {"model": "llm", "messages": CHAT, "max_tokens": 1,
                                                           "logprobs": True, "top_logprobs": 20})
    assert r.status_code == 200, r.text


def test_tokenize_counts_what_llm_counts_and_detokenize_round_trips(openai_server):
    base = openai_server.base
    chat = _post(base, "/v1/chat/completions", {"model": "llm", "messages": CHAT, "max_tokens": 1, "temperature": 0})
    comp = _post(base, "/v1/completions", {"model": "llm", "prompt": "Once upon a time, \u4f60\u597d",
                                           "max_tokens": 1, "temperature": 0})
    t_chat = _post(base, "/tokenize", {"model": "llm", "messages": CHAT}).json()
    t_comp = _post(base, "/tokenize", {"prompt": "Once upon a time, \u4f60\u597d", "return_token_strs": True}).json()
    # the engine tokenizes with paddleformers inside llm; the frontend with transformers: same counts
    assert t_chat["count"] == chat.json()["usage"]["prompt_tokens"] == len(t_chat["tokens"])
    assert t_comp["count"] == comp.json()["usage"]["prompt_tokens"]
    assert t_comp["max_model_len"] == 8192  # SmolLM2's max_position_embeddings (llm's max_model_len 0)
    assert len(t_comp["token_strs"]) == t_comp["count"] and t_chat["token_strs"] is None
    assert _post(base, "/detokenize", {"tokens": t_comp["tokens"]}).json() == {"prompt": "Once upon a time, \u4f60\u597d"}
    text = _post(base, "/detokenize", {"model": "llm", "tokens": t_chat["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>") and CHAT[0]["content"] in text


def test_tokenize_errors_name_the_field(openai_server):
    base = openai_server.base
    _error(_post(base, "/tokenize", {"prompt": "a", "messages": CHAT}), 400, "prompt")
    _error(_post(base, "/tokenize", {}), 400, "prompt")
    _error(_post(base, "/tokenize", {"model": "nope", "prompt": "a"}), 404, "model")
    assert "[0, 49152)" in _error(_post(base, "/detokenize", {"tokens": [1, 49152]}), 400, "tokens")["message"]
    _error(_post(base, "/detokenize", {"tokens": "abc"}), 400, "tokens")


def test_a_frontend_whose_triton_is_not_ready_refuses_cleanly(smollm2_dir, tmp_path):
    """Nothing listens on its Triton ports (a server still starting): /v1 routes and /tokenize answer
    503 model_not_ready with Retry-After; /health/ready is 503; no answer shows an address."""
    grpc_port, metrics_port, port = launcher.free_ports(3)
    fe = start_frontend(grpc_port, metrics_port, port, smollm2_dir, log_path=tmp_path / "fe.log", drain_grace=1)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                r = requests.get(f"{base}/health", timeout=2)
                break
            except requests.ConnectionError:
                assert fe.running() and time.monotonic() < deadline, fe.log_tail()
                time.sleep(0.1)
        assert requests.get(f"{base}/health/ready", timeout=5).status_code == 503
        answers = [requests.get(f"{base}/v1/models", timeout=10),
                   _post(base, "/v1/chat/completions", {"model": "llm", "messages": CHAT}),
                   _post(base, "/v1/completions", {"model": "llm", "prompt": "Hi"}),
                   _post(base, "/tokenize", {"prompt": "Hi"})]
        for r in answers:
            assert r.status_code == 503 and r.headers.get("Retry-After") == "1", (r.status_code, r.text)
            err = r.json()["error"]
            assert err["code"] == "model_not_ready" and "not ready" in err["message"], err
            assert "127.0.0.1" not in r.text and "StatusCode" not in r.text and str(grpc_port) not in r.text
    finally:
        fe.stop(10)


def test_cached_tokens_count_the_prompt_blocks_found_in_the_prefix_cache(openai_server):
    """usage.prompt_tokens_details.cached_tokens (OpenAI's and vLLM's field): 0 for a prompt the server
    has not seen, then every full 64-token block of it but the one holding its last token (the engine
    computes that token's logits): 64 * floor((prompt_tokens - 1) / 64), streamed and not, chat and
    completions."""
    import uuid

    base = openai_server.base
    tag = uuid.uuid4().hex
    text = f"Session {tag}. " + " ".join(f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}."
                                           for i in range(40))
    chat = {"model": "llm", "messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0}
    first = _post(base, "/v1/chat/completions", chat).json()["usage"]
    assert first["prompt_tokens"] > 3 * 64 and first["prompt_tokens_details"] == {"cached_tokens": 0}, first
    want = 64 * ((first["prompt_tokens"] - 1) // 64)
    again = _post(base, "/v1/chat/completions", chat).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == want, (again, want)
    with requests.post(f"{base}/v1/chat/completions", json=dict(chat, stream=True,
                                                              stream_options={"include_usage": True}),
                       stream=True, timeout=120) as r:
        events = [line for line in r.iter_lines() if line.startswith(b"data: {")]
    import json

    assert json.loads(events[-1][6:])["usage"]["prompt_tokens_details"]["cached_tokens"] == want
    comp = {"model": "llm", "prompt": f"Other {tag} " + text, "max_tokens": 2, "temperature": 0}
    c1 = _post(base, "/v1/completions", comp).json()["usage"]
    c2 = _post(base, "/v1/completions", comp).json()["usage"]
    assert c1["prompt_tokens_details"]["cached_tokens"] == 0
    assert c2["prompt_tokens_details"]["cached_tokens"] == 64 * ((c2["prompt_tokens"] - 1) // 64)


def test_json_nested_thousands_deep_is_a_400_naming_the_field(openai_server):
    """A body nested 20,000 arrays deep: 400, not a 500 RecursionError; a response_format schema
    nested deeper than llm takes (100 levels) is refused naming the parameter; the server keeps
    serving."""
    base = openai_server.base
    deep = "[" * 20000 + "]" * 20000
    r = requests.post(f"{base}/v1/chat/completions", data=f'{{"model": "llm", "messages": {deep}}}',
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "error parsing the body" in r.json()["error"]["message"], r.text  # FastAPI's
    r = requests.post(f"{base}/v1/chat/completions", timeout=30, json={
        "model": "llm", "messages": CHAT, "max_tokens": 2, "response_format": {
            "type": "json_schema", "json_schema": {"name": "deep", "schema": _deep_schema(200)}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert _post(base, "/v1/chat/completions", {"model": "llm", "messages": CHAT, "max_tokens": 2}).status_code == 200


def _deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_the_frontend_serves_within_seconds_of_its_triton_coming_back(smollm2_dir, tmp_path):
    """The frontend starts before its Triton and fails to reach it for 10 s (gRPC's reconnect back-off
    grows meanwhile, by default up to 120 s), then tritonserver starts on its port: the frontend is
    ready within 2 s of Triton's readiness (its back-off is capped at 1 s; 3.5 s measured without the
    cap). The 3-minute soak saw 503s for ~5 s after a restarted tritonserver was back before the cap."""
    from paddle_llm_launcher import start_server

    http_port, grpc_port, metrics_port, port = launcher.free_ports(4)
    fe = start_frontend(grpc_port, metrics_port, port, smollm2_dir, log_path=tmp_path / "fe.log", drain_grace=1)
    server = None
    try:
        base = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10.0:  # the frontend keeps trying an absent Triton
            try:
                assert requests.get(f"{base}/health/ready", timeout=2).status_code == 503
            except requests.ConnectionError:
                assert fe.running(), fe.log_tail()
            time.sleep(0.25)
        repo = Path(__file__).resolve().parents[2] / "model_repository"
        server = start_server(repo, http_port, grpc_port, metrics_port, model_dir=smollm2_dir,
                              log_path=tmp_path / "triton.log")
        server.wait_ready(300)
        t_ready = time.monotonic()
        while requests.get(f"{base}/health/ready", timeout=5).status_code != 200:
            assert time.monotonic() - t_ready < 30, "the frontend did not come back within 30 s"
            time.sleep(0.05)
        lag = time.monotonic() - t_ready
        print(f"\n[openai] ready {lag * 1000:.0f} ms after its Triton")
        assert lag < 2.0, lag
        r = _post(base, "/v1/chat/completions", {"model": "llm", "messages": CHAT, "max_tokens": 2})
        assert r.status_code == 200, r.text
    finally:
        fe.stop(10)
        if server is not None:
            server.stop()


def test_without_runtime_lora_updating_vllms_lora_routes_do_not_exist(openai_server):
    """The shipped config (enable_lora 0): /v1/load_lora_adapter and /v1/unload_lora_adapter answer
    404 "Not Found" whatever the body, as an unknown route does (vLLM registers them only with
    VLLM_ALLOW_RUNTIME_LORA_UPDATING); the model list holds the served names only."""
    base = openai_server.base
    unknown = requests.post(f"{base}/v1/no_such_route", json={}, timeout=10)
    for path, body in (("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}),
                       ("/v1/load_lora_adapter", {"bad": 1}), ("/v1/unload_lora_adapter", {"lora_name": "x"})):
        r = _post(base, path, body)
        assert (r.status_code, r.json()) == (404, unknown.json()), r.text
    models = requests.get(f"{base}/v1/models", timeout=10).json()["data"]
    assert sorted(m["id"] for m in models) == sorted({openai_server.model, "llm"})
    assert all(m["parent"] is None for m in models)
