"""The server of `make serve` stays up by itself (docs/operations/reliability.md): scripts/launch_triton.py (what
`make serve` runs: supervised tritonserver) on a repository copy, driven by tritonclient.

- SIGKILL of the llm stub with streams in flight on both models: readiness turns false at once, the
  streams end with an error (none hangs: every wait is bounded), the server serves again by itself
  and llm_engine_restarts counts it;
- an engine failure (test-only fault injection after N steps): llm_engine_healthy 0, the supervisor
  reloads the model, requests succeed again;
- SIGKILL of a tensor-parallel worker (tiny Llama, TP=2): the same;
- SIGTERM with streams in flight: readiness false at once, a new request refused with the drain's
  UNAVAILABLE message, the streams in flight finish normally (HTTP `generate_stream` ones too, none
  held back until the drain's end by a load pending on Triton's HTTP worker thread), the launcher exits
  0 and Triton logged no error line;
- who may call it (paddle_llm_launcher/admin_api.py): a repository load that uploads a model.py is refused over
  HTTP and gRPC without the admin header or with a wrong one (the uploaded code never runs: the marker
  it would write never appears, while the same upload with the operator's TRITON_ADMIN_KEY does run
  it), unload of `llm` is refused and `llm` keeps serving, shared-memory registration is refused.
Times are printed (the soak reports them under load); the asserted bounds are generous time-outs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import requests

from http_clients import iter_sse
from clients import GrpcStream, ensemble_inputs, llm_inputs, llm_stream, run_concurrently, scrape_metrics
from repo_edit import copy_repository, set_config_parameter
from supervised import SupervisedServer
from tiny_model import make_tiny_llama

pytestmark = pytest.mark.e2e

FAULT_AFTER_STEPS = 400
LONG = {"temperature": "0", "max_tokens": "300", "ignore_eos": "true"}
SHORT = {"temperature": "0", "max_tokens": "8"}
RECOVER_S = 180  # generous: a restart loads every model again on a loaded 2-core machine
ADMIN_KEY = "operator-key-for-the-reliability-tests"  # TRITON_ADMIN_KEY of the module's server


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_dir):
    tmp = tmp_path_factory.mktemp("supervised")

    def edit(repo):
        cfg = repo / "llm" / "config.pbtxt"
        set_config_parameter(cfg, "fault_inject_after_steps", str(FAULT_AFTER_STEPS))
        set_config_parameter(cfg, "num_kv_blocks", "64")
        set_config_parameter(cfg, "max_model_len", "2048")

    s = SupervisedServer(copy_repository(tmp / "model_repository", edit=edit), smollm2_dir, tmp / "launcher.log",
                         drain_grace=60, env={"TRITON_ADMIN_KEY": ADMIN_KEY})
    s.wait(s.ready, 300, "ready")
    yield s
    s.stop()


def _short_ok(s: SupervisedServer) -> None:
    r = llm_stream(s.grpc_url, "Hello", True, SHORT, timeout=120)
    assert r.error is None and r.final_seen and r.text, r.error
    r = GrpcStream(s.grpc_url, "ensemble", ensemble_inputs("Hello", max_tokens=8, stream=True), timeout=120).collect()
    assert r.error is None and r.final_seen and r.text, r.error


def _restarts(s: SupervisedServer) -> float:
    return scrape_metrics(s.metrics_url).value("llm_engine_restarts", model="llm")


def _started(stream: GrpcStream) -> GrpcStream:
    """The stream once its first response arrived (kept as stream.first: collect() returns the rest)."""
    result, err = stream.next(timeout=120)
    assert err is None, f"stream failed before the test acted: {err}"
    stream.first = result
    return stream


def _tokens(stream: GrpcStream, rest, name: str) -> int:
    """Tokens of a whole stream: `name` per response (num_output_tokens: its value; output_log_probs:
    one entry per token), the first response included."""
    arrays = [a for a in [stream.first.as_numpy(name)] + rest.all(name) if a is not None]
    return sum(int(a.reshape(-1)[0]) if name == "num_output_tokens" else a.size for a in arrays)


def test_sigkill_of_the_llm_stub_is_recovered_without_a_person(server):
    s = server
    _short_ok(s)
    streams = [_started(GrpcStream(s.grpc_url, "llm", llm_inputs("Once upon a time", True, LONG), timeout=300)),
               _started(GrpcStream(s.grpc_url, "ensemble", ensemble_inputs(
                   "Tell me a story", max_tokens=300, min_tokens=300, temperature=0.0, stream=True), timeout=300))]
    victim = s.stubs()[("llm", "llm_0_0")]
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    not_ready = s.wait(lambda: not s.ready(), 30, "not ready after the kill", poll=0.05)
    llm_r, ens_r = run_concurrently([st.collect for st in streams], timeout=RECOVER_S + 60)
    assert llm_r.error is not None, f"llm stream did not end with an error ({len(llm_r.responses)} responses)"
    assert ens_r.error is not None and "llm instance llm_0_0 closed its engine channel" in str(ens_r.error), \
        str(ens_r.error)
    s.wait(s.ready, RECOVER_S, "ready again")
    back = time.monotonic() - t0
    _short_ok(s)
    assert _restarts(s) == 1
    out = s.output()
    assert f"supervisor: model llm: stub llm_0_0 (pid {victim}) exited" in out, out[-2000:]
    print(f"\n[reliability] llm stub SIGKILLed with 2 streams in flight: not ready after {not_ready:.2f} s, "
          f"serving again after {back:.1f} s; llm stream: {llm_r.error}; ensemble stream: {ens_r.error}")


def test_engine_failure_is_reloaded(server):
    s = server
    before = _restarts(s)
    r = GrpcStream(s.grpc_url, "llm", llm_inputs("Count slowly", True,
                                                 {"temperature": "0", "max_tokens": "600", "ignore_eos": "true"}),
                   timeout=300).collect()
    assert r.error is not None and "fault injected after" in str(r.error), str(r.error)
    t0 = time.monotonic()
    s.wait(lambda: not s.ready(), 60, "not ready after the engine failure", poll=0.05)
    s.wait(s.ready, RECOVER_S, "ready again")
    _short_ok(s)
    assert _restarts(s) == before + 1
    assert "reports an engine failure (InjectedFault: fault injected after" in s.output(), s.output()[-2000:]
    print(f"\n[reliability] engine failure: serving again {time.monotonic() - t0:.1f} s after the failed request ended")


def test_an_unload_lets_the_streams_in_flight_finish_and_the_supervisor_loads_it_again(server):
    """Triton 2.51 unloads a decoupled model only after its streams in flight ended (the response
    factory holds it): the stream completes with every token, then the instance is finalized (were it
    finalized first, llm would end the stream with UNAVAILABLE "was unloaded": unit-tested), and the
    supervisor, seeing its stub gone, loads it again."""
    import tritonclient.http as httpclient

    s = server
    before = _restarts(s)
    served_before = s.output().count("supervisor: model llm: serving again")
    stream = _started(GrpcStream(s.grpc_url, "llm", llm_inputs("Once upon a time", True, LONG,
                                                                return_num_output_tokens=True), timeout=300))
    t0 = time.monotonic()
    httpclient.InferenceServerClient(f"127.0.0.1:{s.http_port}", network_timeout=300).unload_model(
        "llm", headers={"paddle-llm-admin-key": ADMIN_KEY})
    (rest,) = run_concurrently([stream.collect], timeout=300)
    assert rest.error is None and rest.final_seen, f"{rest.error} after {len(rest.responses)} more responses"
    assert _tokens(stream, rest, "num_output_tokens") == 300
    # Triton 2.51 counts an unloaded model as no obstacle to readiness: wait for the supervisor's reload
    s.wait(lambda: s.output().count("supervisor: model llm: serving again") > served_before, RECOVER_S,
           "the supervisor's reload")
    s.wait(s.ready, RECOVER_S, "ready again")
    _short_ok(s)
    assert _restarts(s) == before + 1
    print(f"\n[reliability] unload with a 300-token stream in flight: the stream completed, serving again "
          f"{time.monotonic() - t0:.1f} s after the unload")


def _probe_model(marker: Path) -> tuple[str, dict[str, bytes]]:
    """A Python-backend model whose files travel in a load request (Triton's repository extension:
    `config` + `file:<path>` parameters): its initialize() writes `marker`, i.e. runs uploaded code."""
    config = json.dumps({"name": "probe", "backend": "python", "max_batch_size": 0,
                         "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
                         "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}]})
    code = (f"class TritonPythonModel:\n    def initialize(self, args):\n"
            f"        open({str(marker)!r}, 'w').write('uploaded code ran')\n"
            f"    def execute(self, requests):\n        return []\n")
    return config, {"file:1/model.py": code.encode()}


def test_uploaded_model_code_and_unload_are_refused_without_the_admin_key(server, tmp_path):
    import grpc
    import requests as rq
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    s = server
    marker = tmp_path / "uploaded_code_ran"
    config, files = _probe_model(marker)
    body = {"parameters": {"config": config, **{k: base64.b64encode(v).decode() for k, v in files.items()}}}
    url = f"{s.http_base}/v2/repository/models/probe/load"
    for headers in ({}, {"paddle-llm-admin-key": "not-the-key-0123456789"}):
        r = rq.post(url, json=body, headers=headers, timeout=60)
        assert r.status_code == 403 and "restricted" in r.text, (r.status_code, r.text)
        r = rq.post(f"{s.http_base}/v2/repository/models/llm/unload", headers=headers, timeout=60)
        assert r.status_code == 403, (r.status_code, r.text)
    shm = rq.post(f"{s.http_base}/v2/systemsharedmemory/region/r0/register",
                  json={"key": "/probe", "offset": 0, "byte_size": 64}, timeout=10)
    assert shm.status_code == 403, (shm.status_code, shm.text)
    client = grpcclient.InferenceServerClient(s.grpc_url)
    for call in (lambda: client.load_model("probe", config=config, files=files),
                 lambda: client.unload_model("llm"),
                 lambda: client.get_model_repository_index()):
        with pytest.raises(InferenceServerException, match="restricted"):
            call()
    time.sleep(1.0)  # a load that got through would have finished before its answer; be generous
    assert not marker.exists(), "uploaded model code ran"
    assert s.ready()
    _short_ok(s)  # llm was not unloaded
    # the same upload with the operator's key (TRITON_ADMIN_KEY): this proves the payload above is
    # code that runs when the API is open, so the refusals are what kept it from running
    admin = {"triton-grpc-protocol-paddle-llm-admin-key": ADMIN_KEY}
    try:
        client.load_model("probe", config=config, files=files, headers=admin)
        assert marker.read_text() == "uploaded code ran"
    finally:
        try:
            client.unload_model("probe", headers=admin)
        except (InferenceServerException, grpc.RpcError):
            pass
    client.close()
    # unload returns at once; Triton 2.51 reports the server not ready until the probe is gone (~1 s)
    s.wait(s.ready, 60, "ready again after the probe's unload")
    _short_ok(s)


class _HttpStream(threading.Thread):
    """One `llm` generate_stream on its own HTTP connection; `first` is set at its first chunk, `ended_at`
    (time.monotonic()) and `tokens` (events seen) once its last arrived."""

    def __init__(self, http_base: str, prompt: str, max_tokens: int):
        super().__init__(daemon=True)
        self.url = f"{http_base}/v2/models/llm/generate_stream"
        self.body = {"text_input": prompt, "stream": True,
                     "sampling_parameters": json.dumps({"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})}
        self.first, self.tokens, self.ended_at, self.error = threading.Event(), 0, None, None

    def run(self):
        try:
            with requests.post(self.url, json=self.body, stream=True, timeout=300) as r:
                for ev in iter_sse(r):
                    if "error" in ev:
                        self.error = ev["error"]
                    self.tokens += 1
                    self.first.set()
            self.ended_at = time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = repr(e)
        self.first.set()


def test_sigterm_drains_streams_in_flight_and_exits_zero(server):
    s = server
    s.wait(s.ready, RECOVER_S, "ready before the SIGTERM")  # the premise: readiness turns false by the drain
    # 8 HTTP streams (one per worker thread of Triton's HTTP server, 8 by default) and one long gRPC
    # stream that keeps the drain going: every HTTP stream must end before it does
    http_streams = [_HttpStream(s.http_base, f"Note {i}:", 16) for i in range(8)]
    for h in http_streams:
        h.start()
    for h in http_streams:
        assert h.first.wait(120) and h.error is None, h.error
    long_stream = _started(GrpcStream(s.grpc_url, "llm", llm_inputs("Tale:", True, {
        "temperature": "0", "max_tokens": "200", "ignore_eos": "true"}), timeout=300))
    streams = [_started(GrpcStream(s.grpc_url, "llm", llm_inputs(f"Story {i}:", True,
                                                                 {"temperature": "0", "max_tokens": "48",
                                                                  "ignore_eos": "true"},
                                                                 return_num_output_tokens=True), timeout=300))
               for i in range(2)]
    streams += [_started(GrpcStream(s.grpc_url, "ensemble", ensemble_inputs(
        f"Story {i}:", max_tokens=48, min_tokens=48, temperature=0.0, stream=True), timeout=300)) for i in range(2)]
    s.signal(signal.SIGTERM)
    s.wait(lambda: not s.ready(), 10, "not ready after SIGTERM", poll=0.02)
    refused = llm_stream(s.grpc_url, "Hello", True, SHORT, timeout=60)
    assert refused.error is not None and "shutting down and takes no new requests" in str(refused.error), \
        str(refused.error)
    results = run_concurrently([st.collect for st in streams], timeout=300)
    for r in results:
        assert r.error is None and r.final_seen, r.error
    long_result = long_stream.collect()
    long_ended = time.monotonic()
    assert long_result.error is None and long_result.final_seen, long_result.error
    for h in http_streams:
        h.join(120)
        # events, not tokens: the detokenizer holds back a partial character now and then
        assert h.error is None and 8 <= h.tokens <= 16 and h.ended_at is not None, (h.error, h.tokens)
        assert h.ended_at < long_ended, "an HTTP stream was held back until the drain's end"
    # every stream ran to its end: 48 tokens each (llm: num_output_tokens per response; ensemble: one
    # output_log_probs entry per token)
    assert [_tokens(st, r, "num_output_tokens") for st, r in zip(streams[:2], results[:2])] == [48, 48]
    assert [_tokens(st, r, "output_log_probs") for st, r in zip(streams[2:], results[2:])] == [48, 48]
    code = s.proc.wait(120)
    assert code == 0, s.output()[-3000:]
    assert re.search(r"drained in [0-9.]+ s \(0 request\(s\) were still in flight", s.output()), s.output()[-2000:]
    # a clean drain logs no error line: the readiness gate's pending load ends without failing
    triton_log = s.server_log.read_text(errors="replace")
    assert "successfully unloaded 'llm'" in triton_log, triton_log[-2000:]  # the premise: the right log
    assert not re.search(r"^E\d{4} .*readiness_gate", triton_log, re.M), triton_log[-3000:]


@pytest.fixture(scope="module")
def tp_server(tmp_path_factory, smollm2_dir):
    tmp = tmp_path_factory.mktemp("supervised_tp")
    tiny = str(make_tiny_llama(tmp / "tiny", smollm2_dir))

    def edit(repo):
        cfg = repo / "llm" / "config.pbtxt"
        for k, v in (("model_dir", tiny), ("tensor_parallel_size", "2"), ("num_kv_blocks", "64"),
                     ("block_size", "16"), ("max_model_len", "1024"), ("max_num_seqs", "8"), ("num_threads", "1")):
            set_config_parameter(cfg, k, v)

    s = SupervisedServer(copy_repository(tmp / "model_repository", models=["llm"], edit=edit), smollm2_dir, tmp / "launcher.log")
    s.wait(s.ready, 300, "ready")
    yield s
    s.stop()


def _tp_workers(s: SupervisedServer) -> list[int]:
    stub = s.stubs().get(("llm", "llm_0_0"))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == stub and b"paddle_llm_engine.executor.tp_worker" in cmd:
            found.append(int(entry))
    return sorted(found)


def test_sigkill_of_a_tensor_parallel_worker_is_recovered(tp_server):
    s = tp_server
    workers = _tp_workers(s)
    assert len(workers) == 2, workers
    stream = _started(GrpcStream(s.grpc_url, "llm", llm_inputs("Tell a story:", True,
                                                              {"temperature": "0", "max_tokens": "600",
                                                               "ignore_eos": "true"}), timeout=300))
    os.kill(workers[1], signal.SIGKILL)
    t0 = time.monotonic()
    r = stream.collect()
    assert r.error is not None and "tensor-parallel worker rank 1" in str(r.error), str(r.error)
    s.wait(lambda: not s.ready(), 60, "not ready after the worker died", poll=0.05)
    s.wait(s.ready, RECOVER_S, "ready again")
    r = llm_stream(s.grpc_url, "Hello", True, SHORT, timeout=120)
    assert r.error is None and r.final_seen, r.error
    new = _tp_workers(s)
    assert len(new) == 2 and not set(new) & set(workers), (workers, new)
    print(f"\n[reliability] TP worker SIGKILLed: serving again after {time.monotonic() - t0:.1f} s")
