"""`instance_group { count: 2 kind: KIND_CPU }` on `llm` (on a copy of the repository; the shipped
config keeps one instance): two stub processes, each with its own engine on its own device id, both
serving under concurrent load, and cancellation / `stop` reaching whichever instance runs a request."""

from __future__ import annotations

import re
import time

import pytest

from clients import GrpcStream, ensemble_inputs, llm_inputs, llm_stream, run_concurrently, scrape_metrics
from metrics_util import is_idle, wait_for
from repo_edit import set_config_parameter, set_instance_count

pytestmark = pytest.mark.e2e

INSTANCES = ("llm_0_0", "llm_0_1")
LONG = {"temperature": "0", "max_tokens": "200", "ignore_eos": "true"}


def _two_instances(repo):
    cfg = repo / "llm" / "config.pbtxt"
    set_instance_count(cfg, 2)
    set_config_parameter(cfg, "num_kv_blocks", "64")  # small KV caches: two engines on one host
    set_config_parameter(cfg, "max_model_len", "2048")
    set_config_parameter(cfg, "num_threads", "1")     # one core each on the 2-core CI machine


@pytest.fixture(scope="module")
def server(triton_server_factory):
    return triton_server_factory(_two_instances)


def per_instance(m, name, **labels) -> dict:
    return {inst: m.value(name, model="llm", version="1", instance=inst, **labels) for inst in INSTANCES}


def test_two_stub_processes_two_engines_on_their_own_device_ids(server):
    stubs = server.handle._stubs  # pids of the server's stub processes, recorded at ready
    cmdlines = []
    for pid in stubs:
        try:
            cmdlines.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode())
        except OSError:
            pass
    llm_stubs = [c for c in cmdlines if "/llm/1/model.py" in c]
    assert len(llm_stubs) == 2, cmdlines
    log = server.log_path.read_text(errors="replace")
    for k, inst in enumerate(INSTANCES):
        m = re.search(rf"llm instance {inst}: EngineConfig\(.*?device_id=(\d+)", log)
        assert m, f"no engine config logged for {inst}"
        assert int(m.group(1)) == k, f"{inst} on device id {m.group(1)}, expected {k}"
    assert len(re.findall(r"engine ready on", log)) == 2, "expected one engine per instance"
    m = scrape_metrics(server.metrics_url)
    free = per_instance(m, "llm_kv_cache_free_blocks")
    assert free == {inst: 64 for inst in INSTANCES}, free  # each engine has its own 64-block cache


def test_both_instances_serve_under_concurrent_load(server):
    before = per_instance(scrape_metrics(server.metrics_url), "llm_requests_total", finish_reason="length")
    grown = {}
    for _ in range(6):  # rounds of 4 concurrent streams until both instances have served
        run_concurrently([lambda i=i: llm_stream(server.grpc_url, f"Count to {i + 3}:", stream=True,
                                                 sampling_parameters={"temperature": "0", "max_tokens": "16",
                                                                      "ignore_eos": "true"}).raise_for_error()
                          for i in range(4)])
        after = wait_for(server.metrics_url, is_idle, timeout=30)[0]
        now = per_instance(after, "llm_requests_total", finish_reason="length")
        grown = {inst: now[inst] - before[inst] for inst in INSTANCES}
        if all(v > 0 for v in grown.values()):
            break
    assert all(v > 0 for v in grown.values()), f"requests finished per instance: {grown}"
    tokens = per_instance(after, "llm_generation_tokens_total")
    assert all(v > 0 for v in tokens.values()), tokens
    # vLLM's names: one series per instance (label engine), the same values as the llm_ ones
    for llm_name, vllm_name, labels in (("llm_requests_total", "vllm:request_success_total", {"finish_reason": "length"}),
                                        ("llm_generation_tokens_total", "vllm:generation_tokens_total", {}),
                                        ("llm_prompt_tokens_total", "vllm:prompt_tokens_total", {})):
        vl = {k.replace("finish_reason", "finished_reason"): v for k, v in labels.items()}
        per_engine = {inst: after.value(vllm_name, model_name="llm", engine=inst, **vl) for inst in INSTANCES}
        assert per_engine == per_instance(after, llm_name, **labels), (vllm_name, per_engine)
    info = {l["engine"]: l["num_gpu_blocks"] for l, _ in after.find("vllm:cache_config_info", model_name="llm")}
    assert info == {inst: "64" for inst in INSTANCES}, info


def test_ensemble_cancel_and_stop_reach_the_instance_that_runs_the_request(server):
    """Two long requests in flight (one per instance when both are used): one ensemble stream
    cancelled, one llm request stopped by id; whichever instance receives the stop, both end."""
    murl = server.metrics_url
    wait_for(murl, is_idle, timeout=30)
    ens = GrpcStream(server.grpc_url, "ensemble", ensemble_inputs("Once upon a time", max_tokens=200, min_tokens=200,
                                                                  temperature=0.0, stream=True))
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer("llm", llm_inputs("Tell me a story", True, LONG), request_id="two-inst-1",
                                  enable_empty_final_response=True)
        for _ in range(2):
            assert ens.next(timeout=60)[1] is None
            assert q.get(timeout=60)[1] is None
        wait_for(murl, lambda m: sum(per_instance(m, "llm_num_requests_running").values()) == 2, timeout=10)
        t0 = time.monotonic()
        ens.cancel()
        stop = grpcclient.InferInput("stop", [1], "BOOL")
        stop.set_data_from_numpy(np.array([True]))
        client.async_stream_infer("llm", [stop], request_id="two-inst-1", enable_empty_final_response=True)
        wait_for(murl, is_idle, timeout=5)
        freed = time.monotonic() - t0
    finally:
        client.stop_stream()
        client.close()
    assert freed < 3.0, f"blocks freed only {freed:.2f} s after cancel + stop"
    m = scrape_metrics(murl)
    assert sum(per_instance(m, "llm_requests_total", finish_reason="abort").values()) >= 2


def test_stop_received_by_the_other_instance_is_forwarded(server):
    """Triton routes a stop request to any instance. Repeat start + stop until the log shows a stop
    that arrived at the instance NOT running the request ("0 request(s) aborted on ..."): the
    request must still end at once (forwarded over paddle_llm_triton/engine_channel/control_bus.py)."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    murl = server.metrics_url
    stop = grpcclient.InferInput("stop", [1], "BOOL")
    stop.set_data_from_numpy(np.array([True]))
    crossed, times = [], []
    for attempt in range(10):
        wait_for(murl, is_idle, timeout=30)
        rid = f"cross-{attempt}-{time.monotonic_ns()}"
        q: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda result, error: q.put((result, error)))
        try:
            client.async_stream_infer("llm", llm_inputs("Tell me a story", True, LONG), request_id=rid,
                                      enable_empty_final_response=True)
            assert q.get(timeout=60)[1] is None
            t0 = time.monotonic()
            client.async_stream_infer("llm", [stop], request_id=rid, enable_empty_final_response=True)
            wait_for(murl, is_idle, timeout=5)
            times.append(time.monotonic() - t0)
        finally:
            client.stop_stream()
            client.close()
        log = server.log_path.read_text(errors="replace")
        if re.search(rf"stop request for id '{rid}': 0 request\(s\) aborted on", log):
            crossed.append(times[-1])
            break
    assert crossed, f"no stop landed on the other instance in {len(times)} tries (cannot test forwarding)"
    assert max(times) < 3.0, times
    print(f"\n[cancel] llm, 2 instances, stop forwarded to the sibling: freed {crossed[0] * 1000:.0f} ms after the stop")
