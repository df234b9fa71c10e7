"""One `llm` instance with tensor_parallel_size 2 (gloo on CPU) in the real tritonserver, on a copy
of the repository with a tiny random Llama (4 heads, 2 KV heads, SmolLM2's tokenizer; SmolLM2's 9
heads admit no TP=2): concurrent streams give the tokens of a TP=1 engine; a SIGKILLed worker fails
the streams in flight with an error naming it, and the other worker goes too; SIGTERM of the
server and SIGKILL of the stub leave no worker. Every wait is bounded by events and time-outs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from clients import GrpcStream, llm_inputs, llm_stream, run_concurrently
from repo_edit import set_config_parameter
from tiny_model import make_tiny_llama

pytestmark = pytest.mark.e2e

PROMPTS = ["Count to five:", "The capital of France is", "Name three colours.", "Once upon a time"]
GREEDY = {"temperature": "0", "max_tokens": "12", "ignore_eos": "true"}
LONG = {"temperature": "0", "max_tokens": "600", "ignore_eos": "true"}
# Streams that must still run when Triton's 5 s exit timeout ends: on an idle host a step takes
# ~7-9 ms here, so 600 tokens can finish inside it; 3000 tokens take 20 s or more (the server of that
# test has the room: max_model_len 4096, 512 blocks of 16 tokens, a checkpoint with 4096 positions).
OUTLAST = {"temperature": "0", "max_tokens": "3000", "ignore_eos": "true"}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, smollm2_dir) -> str:
    # positions up to 4096 for the SIGTERM test's long streams (the others run at max_model_len 1024)
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny_tp"), smollm2_dir, max_position_embeddings=4096))


def _tp2(model_dir: str, max_model_len: int = 1024, num_kv_blocks: int = 64):
    def edit(repo):
        cfg = repo / "llm" / "config.pbtxt"
        set_config_parameter(cfg, "model_dir", model_dir)
        set_config_parameter(cfg, "tensor_parallel_size", "2")
        set_config_parameter(cfg, "num_kv_blocks", str(num_kv_blocks))
        set_config_parameter(cfg, "block_size", "16")
        set_config_parameter(cfg, "max_model_len", str(max_model_len))
        set_config_parameter(cfg, "max_num_seqs", "8")
        set_config_parameter(cfg, "num_threads", "1")
    return edit


def _start(factory, tiny_dir, **config):
    return factory(_tp2(tiny_dir, **config), models=["llm"], ready_timeout=300)


def _workers(server) -> list[int]:
    """Pids of the tensor-parallel workers whose parent is one of the server's stubs."""
    server.handle.remember_stubs()
    stubs, found = set(server.handle._stubs), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _alive(int(entry)):
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid in stubs and b"paddle_llm_engine.executor.tp_worker" in cmd:
                found.append(int(entry))
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _gone(pids, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _expected_texts(tiny_dir) -> list[str]:
    """The same prompts on a TP=1 engine in this process."""
    from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams
    from paddle_llm_engine.tokenizer import encode_prompt

    engine = LLMEngine(EngineConfig(model_dir=tiny_dir, device="cpu", block_size=16, num_kv_blocks=64,
                                    max_model_len=1024, num_threads=1))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), encode_prompt(engine.tokenizer, p), params)
    texts = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
    return [texts[str(i)] for i in range(len(PROMPTS))]


def _in_flight(server, n: int = 2, params: dict = LONG) -> list[GrpcStream]:
    """n long streams, each past its first response."""
    streams = [GrpcStream(server.grpc_url, "llm", llm_inputs(f"Tell story {i}:", True, params), timeout=120)
               for i in range(n)]
    for s in streams:
        result, err = s.next(timeout=120)
        assert err is None, f"stream failed before the test acted: {err}"
    return streams


def _check_engine_info(server) -> None:
    """llm_engine_info of the TP=2 instance names what its ranks run (their platform plan), as an
    engine built here decides it, not the "auto" settings."""
    from paddle_llm_engine.platforms import plan_for_device

    from clients import scrape_metrics

    info = scrape_metrics(server.metrics_url).find("llm_engine_info", model="llm", instance="llm_0_0")
    assert len(info) == 1 and info[0][1] == 1, info
    labels, plan = info[0][0], plan_for_device("cpu")
    kernels = ";".join(k for k, on in plan.kernels.items() if on).replace(
        "cpu_kernels", f"cpu_kernels_{plan.cpu_isa}") or "composed"
    assert labels["tensor_parallel_size"] == "2"
    assert (labels["dtype"], labels["kv_cache_dtype"]) == (plan.dtype, plan.kv_cache_dtype)
    assert plan.dtype == plan.kv_cache_dtype == "float32"
    assert labels["kernels"] == kernels and labels["quantization"] == "none"


def test_tp2_instance_serves_concurrent_streams_as_tp1(triton_server_factory, tiny_dir):
    expected = _expected_texts(tiny_dir)
    server = _start(triton_server_factory, tiny_dir)
    workers = _workers(server)
    assert len(workers) == 2, f"expected 2 tensor-parallel workers, found {workers}"
    _check_engine_info(server)
    for _ in range(2):  # twice: the second round runs on warm caches, prefix-cache hits included
        results = run_concurrently([lambda p=p: llm_stream(server.grpc_url, p, True, GREEDY, timeout=120)
                                    .raise_for_error() for p in PROMPTS], timeout=300)
        assert [r.text for r in results] == expected

    # a SIGKILLed worker: the streams in flight end with an error naming it, the other worker goes too
    streams = _in_flight(server)
    os.kill(workers[1], signal.SIGKILL)
    results = run_concurrently([s.collect for s in streams], timeout=180)
    for r in results:
        assert r.error is not None, f"no error after a worker died ({len(r.responses)} responses)"
        assert "engine failure" in str(r.error) and "tensor-parallel worker rank 1" in str(r.error), str(r.error)
        assert "killed by SIGKILL" in str(r.error), str(r.error)
    assert _gone(workers) == []
    after = llm_stream(server.grpc_url, "Hello", True, GREEDY, timeout=60)
    assert after.error is not None and "is not serving" in str(after.error), str(after.error)


def test_sigterm_of_the_server_leaves_no_worker(triton_server_factory, tiny_dir):
    server = _start(triton_server_factory, tiny_dir, max_model_len=4096, num_kv_blocks=512)
    workers = _workers(server)
    assert len(workers) == 2, workers
    streams = _in_flight(server, params=OUTLAST)
    server.handle.stop()  # SIGTERM (the launcher's watchdog SIGKILLs after its grace period)
    results = run_concurrently([s.collect for s in streams], timeout=180)
    assert all(r.error is not None for r in results), [len(r.responses) for r in results]
    assert _gone(workers) == []


def test_sigkill_of_the_stub_leaves_no_worker(triton_server_factory, tiny_dir):
    server = _start(triton_server_factory, tiny_dir)
    workers = _workers(server)
    assert len(workers) == 2, workers
    stub = int(Path(f"/proc/{workers[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(stub, signal.SIGKILL)
    assert _gone(workers) == [], "a worker outlived its stub"
    server.handle.stop()
