"""Multi-LoRA through the real tritonserver, one server for every check (CI time): `llm` with two
instances (two stub processes, two engines), enable_lora 1, adapter `a` from multi_lora.json beside
the model (a path relative to that file, as Triton's vLLM backend reads it), adapter `b` from the
lora_modules parameter, allow_runtime_lora_updating with a lora_root; adapters made by
tests/support/lora_adapters.py (magnitude 3: their greedy tokens differ from the base model's).

The reference for an adapter's output is independent of the LoRA code: the engine on the checkpoint
merge_adapter writes (W + scale * B A in every adapted weight), run offline here, greedy. Its
top-1 / top-2 logit gaps are checked to be far above the two paths' differences (~1e-4).

- gRPC streaming and HTTP generate with lora_name give the merged checkpoint's tokens; the vLLM
  backend's own client style (its CI's multi_lora test: sampling_parameters JSON with lora_name,
  string values, the same dict as request parameters) too;
- an unknown adapter: INVALID_ARG naming lora_name and the adapter, while another request runs on;
- the OpenAI frontend (the openai SDK): the adapters are models (parent, root), a chat and a
  completion with one give its tokens; runtime load / unload through vLLM's endpoints, behind the
  API key, reaching both instances (asked over their control sockets), vLLM's statuses for the
  refusals, lora_root enforced, and the Triton port no way around the LoRA admin key;
- vllm:lora_requests_info on Triton's metrics endpoint, its running_lora_adapters following a request.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import requests

import paddle_llm_launcher as launcher
from clients import GrpcStream, _tensor, grpc_stream, llm_inputs, run_concurrently, scrape_metrics
from http_clients import http_generate
from lora_adapters import make_adapter, merge_adapter
from repo_edit import set_config_parameter, set_instance_count

pytestmark = pytest.mark.e2e

QUESTION = "Name three colours."
N = 16  # greedy tokens compared
MIN_GAP = 2e-3  # smallest top-1 / top-2 logit gap of the reference (the paths differ by ~1e-4)
API_KEY = "sk-lora-test-0123456789"
INSTANCES = ("llm_0_0", "llm_0_1")


def _reference(model_dir: str, prompt_ids: list[int]) -> list[int]:
    """Greedy tokens of the engine on `model_dir` (the server's engine settings), with their logit gaps
    checked."""
    from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams

    eng = LLMEngine(EngineConfig(model_dir=model_dir, num_kv_blocks=64, max_model_len=2048, num_threads=1))
    try:
        eng.add_request("ref", prompt_ids, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
        tokens, gaps = [], []
        while eng.has_unfinished_requests():
            for o in eng.step(return_logits=True):
                tokens += o.token_ids
                top = np.sort(o.logits)[-2:]
                gaps.append(float(top[1] - top[0]))
    finally:
        eng.close()
    assert min(gaps) > MIN_GAP, f"a near tie in the reference of {model_dir} ({min(gaps)}): pick another prompt"
    return tokens


@pytest.fixture(scope="module")
def lora(tmp_path_factory, smollm2_dir, chat_prompt, tokenizer):
    """Adapters a (multi_lora.json) and b (lora_modules) under lora_root, their references, and a
    folder outside lora_root reached through a symbolic link inside it."""
    from paddle_llm_engine.tokenizer import encode_prompt

    tmp = tmp_path_factory.mktemp("lora")
    root = tmp / "root"
    a = make_adapter(smollm2_dir, root / "a", seed=1, magnitude=3.0)
    b = make_adapter(smollm2_dir, root / "b", seed=2, magnitude=3.0, r=4, targets=("q_proj", "k_proj", "v_proj",
                                                                                   "o_proj"))
    outside = make_adapter(smollm2_dir, tmp / "outside", seed=3)
    os.symlink(outside, root / "escape")
    prompt = chat_prompt(QUESTION)
    ids = encode_prompt(tokenizer, prompt)
    ref = {k: _reference(str(merge_adapter(smollm2_dir, folder, tmp / f"merged_{k}")), ids)
           for k, folder in (("a", a), ("b", b))}
    return {"root": root, "a": a, "b": b, "prompt": prompt, "ref": ref,
            "text": {k: tokenizer.decode(t, skip_special_tokens=True) for k, t in ref.items()}}


@pytest.fixture(scope="module")
def server(triton_server_factory, lora):
    def edit(repo):
        cfg = repo / "llm" / "config.pbtxt"
        set_instance_count(cfg, 2)
        for key, value in (("num_kv_blocks", "64"), ("max_model_len", "2048"), ("num_threads", "1"),
                           ("enable_lora", "1"), ("max_loras", "2"), ("lora_modules", f"b={lora['b']}"),
                           ("allow_runtime_lora_updating", "true"), ("lora_root", str(lora["root"]))):
            set_config_parameter(cfg, key, value)
        version_dir = repo / "llm" / "1"
        (version_dir / "multi_lora.json").write_text(json.dumps({"a": os.path.relpath(lora["a"], version_dir)}))

    return triton_server_factory(edit, models=["llm"])


@pytest.fixture(scope="module")
def frontend(server, smollm2_dir, tmp_path_factory):
    """The OpenAI frontend as `make serve` starts it (the launcher gives it its server's LoRA admin
    key), behind an API key."""
    from paddle_llm_launcher.frontend import start_frontend

    pytest.importorskip("openai")
    port = launcher.free_port()
    handle = start_frontend(server.grpc_port, server.metrics_port, port, smollm2_dir,
                            log_path=tmp_path_factory.mktemp("frontend") / "frontend.log", drain_grace=5.0,
                            env={"VLLM_API_KEY": API_KEY})
    try:
        handle.wait_ready(60)
    except (RuntimeError, TimeoutError) as e:
        handle.stop(10)
        pytest.fail(f"OpenAI frontend did not start: {e}\n{handle.log_tail(60)}", pytrace=False)
    yield handle
    handle.stop(10)
    from paddle_llm_launcher.admin_api import lora_admin_key

    for log in (handle.log_path, server.log_path):  # the LoRA admin key is never written out
        assert lora_admin_key() not in Path(log).read_text(errors="replace"), log


def _tokens_of(logprobs_json) -> list[int]:
    """Token ids of llm's `logprobs` output (per token, the sampled id first)."""
    return [int(next(iter(entry))) for entry in json.loads(logprobs_json)]


def _stream_tokens(result) -> list[int]:
    out = []
    for arr in result.all("logprobs"):
        v = arr.reshape(-1)[0]
        out += _tokens_of(v.decode() if isinstance(v, bytes) else v)
    return out


def greedy(**extra) -> dict:
    return {"temperature": "0", "max_tokens": str(N), "ignore_eos": "true", "logprobs": "0", **extra}


def test_grpc_stream_and_http_generate_give_the_merged_checkpoints_tokens(server, lora):
    s = grpc_stream(server.grpc_url, "llm", llm_inputs(lora["prompt"], True, greedy(lora_name="a"),
                                                       return_logprobs=True)).raise_for_error()
    assert _stream_tokens(s) == lora["ref"]["a"]
    h = http_generate(server.http_base, "llm", {"text_input": lora["prompt"], "exclude_input_in_output": True,
                                                "return_logprobs": True,
                                                "parameters": {"lora_name": "b", "temperature": 0, "max_tokens": N,
                                                               "ignore_eos": True, "logprobs": 0}})
    assert h.status == 200, h.body
    assert _tokens_of(h.body["logprobs"]) == lora["ref"]["b"] and h.body["text_output"] == lora["text"]["b"]
    base = grpc_stream(server.grpc_url, "llm", llm_inputs(lora["prompt"], False, greedy(), return_logprobs=True,
                                                          exclude_input_in_output=True)).raise_for_error()
    assert _stream_tokens(base) not in (lora["ref"]["a"], lora["ref"]["b"]), "the adapters change the output"


def test_the_vllm_backends_client_style(server, lora):
    """Its CI's multi_lora test: sampling_parameters with string values and lora_name, the same dict
    as request parameters, non-streamed, prompt excluded; text_output compared whole."""
    import queue

    import tritonclient.grpc as grpcclient

    sp = {"temperature": "0", "top_p": "1", "max_tokens": str(N), "ignore_eos": "true", "lora_name": "a"}
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer("llm", llm_inputs(lora["prompt"], False, json.dumps(sp),
                                                    exclude_input_in_output=True),
                                  request_id="lora-1", parameters=sp)
        result, error = q.get(timeout=120)
    finally:
        client.stop_stream()
        client.close()
    assert error is None, error
    assert result.as_numpy("text_output")[0].decode() == lora["text"]["a"]


def test_an_unknown_adapter_is_invalid_arg_naming_lora_name_while_another_request_runs(server, lora):
    running = GrpcStream(server.grpc_url, "llm", llm_inputs(lora["prompt"], True, {
        "temperature": "0", "max_tokens": "48", "ignore_eos": "true", "lora_name": "b"},
        return_num_output_tokens=True))
    first, error = running.next(timeout=120)  # generating
    assert error is None, error
    h = http_generate(server.http_base, "llm", {"text_input": "Hello", "parameters": {"lora_name": "nope"}})
    assert h.status == 400, h.body  # INVALID_ARG
    assert h.error.startswith("sampling_parameters.lora_name: ") and "'nope'" in h.error, h.error
    s = grpc_stream(server.grpc_url, "llm", llm_inputs("Hello", True, {"lora_name": "nope"}))
    assert s.error is not None and "lora_name" in s.error.message() and "'nope'" in s.error.message()
    rest = running.collect()
    assert rest.error is None and rest.final_seen
    counts = [int(a.reshape(-1)[0]) for a in [first.as_numpy("num_output_tokens"), *rest.all("num_output_tokens")]]
    assert sum(counts) == 48, counts


def _instance_adapters(server) -> dict:
    """{instance: [(name, path)]} as each llm instance answers over its control socket."""
    from paddle_llm_triton.engine_channel.control_bus import ask

    replies = ask(server.handle.proc.pid, [("llm", i) for i in INSTANCES], {"type": "lora", "action": "list"}, 10)
    return {i: sorted(tuple(x) for x in replies[("llm", i)]["adapters"]) for i in INSTANCES}


def test_openai_models_list_the_adapters_and_a_chat_and_a_completion_use_them(frontend, lora, smollm2_dir):
    import openai

    client = openai.OpenAI(base_url=frontend.url, api_key=API_KEY, max_retries=0, timeout=120)
    base_name = os.path.basename(smollm2_dir)
    cards = {m.id: m for m in client.models.list().data}
    assert {base_name, "llm", "a", "b"} <= set(cards), list(cards)
    assert (cards["b"].parent, cards["b"].root) == (base_name, str(lora["b"]))
    assert (cards["a"].parent, cards["a"].root) == (base_name, str(lora["a"]))  # multi_lora.json's, normalized
    assert getattr(cards["llm"], "parent", None) is None
    chat = client.chat.completions.create(model="a", messages=[{"role": "user", "content": QUESTION}],
                                          max_tokens=N, temperature=0, extra_body={"ignore_eos": True})
    assert chat.model == "a" and chat.choices[0].message.content == lora["text"]["a"]
    done = client.completions.create(model="b", prompt=lora["prompt"], max_tokens=N, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.model == "b" and done.choices[0].text == lora["text"]["b"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def test_runtime_load_and_unload_through_vllms_endpoints(frontend, server, lora):
    import openai

    base, auth = frontend.base, {"Authorization": f"Bearer {API_KEY}"}

    def post(route, body, headers=auth):
        return requests.post(f"{base}/v1/{route}", json=body, headers=headers, timeout=120)

    assert post("load_lora_adapter", {"lora_name": "c", "lora_path": "a"}, headers={}).status_code == 401
    r = post("load_lora_adapter", {"lora_name": "c", "lora_path": "a"})  # relative: under lora_root
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'c' added successfully."), r.text
    on = _instance_adapters(server)
    assert all(("c", "a") in v for v in on.values()), on  # both engines have it
    client = openai.OpenAI(base_url=frontend.url, api_key=API_KEY, max_retries=0, timeout=120)
    assert [m.root for m in client.models.list().data if m.id == "c"] == ["a"]  # as given, as vLLM shows it
    texts = run_concurrently([lambda: client.completions.create(
        model="c", prompt=lora["prompt"], max_tokens=N, temperature=0, extra_body={"ignore_eos": True})
        .choices[0].text for _ in range(4)])  # 4 at once: both instances serve some
    assert texts == [lora["text"]["a"]] * 4  # c is a's folder
    for body, status, type_, words in (
            ({"lora_name": "c", "lora_path": "b"}, 400, "InvalidUserInput", "has already been loaded"),
            ({"lora_name": "d", "lora_path": "escape"}, 400, "BadRequestError", "outside lora_root"),
            ({"lora_name": "d", "lora_path": str(lora["root"] / "missing")}, 404, "NotFoundError", "No adapter found"),
            ({"lora_name": "d"}, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")):
        r = post("load_lora_adapter", body)
        err = r.json()["error"]
        assert (r.status_code, err["type"], err["code"]) == (status, type_, status) and words in err["message"], r.text
    _the_triton_port_needs_the_lora_admin_key(server)
    r = post("unload_lora_adapter", {"lora_name": "c"})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'c' removed successfully."), r.text
    assert all(("c", "a") not in v for v in _instance_adapters(server).values())
    r = post("unload_lora_adapter", {"lora_name": "c"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "The lora adapter 'c' cannot be found."
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="c", prompt="x", max_tokens=1)


def _the_triton_port_needs_the_lora_admin_key(server):
    """A lora_admin request straight to Triton without the key is refused and changes nothing."""
    req = json.dumps({"action": "unload", "lora_name": "c", "key": "not-the-key-0123456789"})
    s = grpc_stream(server.grpc_url, "llm", [_tensor("lora_admin", np.array([req.encode()], dtype=np.object_))])
    assert s.error is not None and "PADDLE_LLM_LORA_ADMIN_KEY" in s.error.message(), s
    assert all(("c", "a") in v for v in _instance_adapters(server).values())
    listed = grpc_stream(server.grpc_url, "llm", [_tensor("lora_admin", np.array([b'{"action": "list"}'],
                                                                                 dtype=np.object_))])
    names = [a["name"] for a in json.loads(listed.raise_for_error().texts()[0])["adapters"]]
    assert {"a", "b", "c"} <= set(names)


def test_lora_requests_info_follows_a_running_request(server, lora):
    m = scrape_metrics(server.metrics_url)
    assert m.types.get("vllm:lora_requests_info") == "gauge"
    series = m.find("vllm:lora_requests_info", model_name="llm")
    assert {s["engine"] for s, _ in series} == set(INSTANCES) and all(s["max_lora"] == "2" for s, _ in series)
    assert all(abs(v - time.time()) < 3600 for _, v in series), series  # a wall-clock time, as vLLM's
    running = GrpcStream(server.grpc_url, "llm", llm_inputs(lora["prompt"], True, {
        "temperature": "0", "max_tokens": "64", "ignore_eos": "true", "lora_name": "a"}))
    seen = None
    try:
        assert running.next(timeout=120)[1] is None
        deadline = time.monotonic() + 20
        while seen is None and time.monotonic() < deadline:
            found = scrape_metrics(server.metrics_url).find("vllm:lora_requests_info", running_lora_adapters="a")
            seen = found[0][0]["engine"] if found else None
            time.sleep(0.05)
    finally:
        running.collect()
    assert seen in INSTANCES, "running_lora_adapters never showed the request's adapter"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if scrape_metrics(server.metrics_url).find("vllm:lora_requests_info", engine=seen, running_lora_adapters=""):
            break
        time.sleep(0.05)
    else:
        pytest.fail("running_lora_adapters did not empty after the request ended")
