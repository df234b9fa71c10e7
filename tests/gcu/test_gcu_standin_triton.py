"""A real tritonserver with two `llm` instances on the stand-in `gcu` plug-in (NOT an Enflame GCU).

`instance_group [ { count: 2 kind: KIND_MODEL } ]`, `device: auto`: instance llm_0_0 must run on
gcu:0 and llm_0_1 on gcu:1 (server log, and the plug-in's per-process memory accounting of each
stub), both must serve concurrent requests (the `instance` label of the metrics), and the text must
equal CPU greedy output for the same prompts.

The Python-backend stub ignores PYTHONPATH: it takes the packages of the venv first on PATH. The
server therefore runs on a throw-away venv (tests/gcu_standin/build.py make_stub_venv) whose .pth
adds the project's .venv site-packages and the stand-in paddle-custom-gcu package; .venv itself is
never changed.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gcu_helpers import REPO, child_env, engine_kwargs, run_child, standin_build

pytestmark = pytest.mark.e2e

INSTANCES = ("llm_0_0", "llm_0_1")
READY_TIMEOUT_S = 420.0  # two engines on the fallback path of a shared 2-core machine
PROMPTS = ["Count to three:", "The capital of France is", "Write one word about the sea.",
           "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z and then"]
MAX_TOKENS = 12
SAMPLING = {"temperature": "0", "max_tokens": str(MAX_TOKENS), "ignore_eos": "true"}


def _launcher():
    name = "launch_triton"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "launch_triton.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _edit_config(cfg: Path) -> None:
    from repo_edit import set_config_parameter

    text = cfg.read_text()
    text, n = re.subn(r"instance_group\s*\[[^\]]*\]", "instance_group [ { count: 2 kind: KIND_MODEL } ]", text)
    assert n == 1, f"no instance_group in {cfg}"
    cfg.write_text(text)
    for key, value in (("device", "auto"), ("num_kv_blocks", "64"), ("block_size", "16"),
                       ("max_model_len", "128"), ("num_threads", "1"), ("max_num_seqs", "8"),
                       ("max_num_batched_tokens", "512"), ("kv_cache_memory_fraction", "0")):
        set_config_parameter(cfg, key, value)


@pytest.fixture(scope="module")
def stub_venv_bin(tmp_path_factory, standin_package) -> Path:
    """A venv without pip layered on .venv + the stand-in package, checked before the server uses it."""
    bin_dir = standin_build.make_stub_venv(tmp_path_factory.mktemp("stub_venv") / "venv",
                                           [standin_build.venv_site_packages(), standin_package])
    probe = ("import importlib.metadata as m, importlib.util as u; "
             "print(m.version('paddle-custom-gcu'), u.find_spec('paddle_llm_engine') is not None, "
             "u.find_spec('paddle') is not None)")
    r = subprocess.run([str(bin_dir / "python3"), "-c", probe], capture_output=True, text=True, timeout=120,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.split()[1:] == ["True", "True"], (r.stdout, r.stderr)
    assert r.stdout.split()[0].endswith("+standin"), r.stdout
    return bin_dir


@pytest.fixture(scope="module")
def gcu_server(tmp_path_factory, stub_venv_bin, standin_plugin_dir, gcu_tiny_model_dir):
    launcher = _launcher()
    tmp = tmp_path_factory.mktemp("gcu_triton")
    repo = tmp / "model_repository"
    repo.mkdir()
    shutil.copytree(REPO / "model_repository" / "llm", repo / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    _edit_config(repo / "llm" / "config.pbtxt")
    log_path = tmp / "tritonserver.log"
    ports = []
    while len(ports) < 3:
        p = launcher.free_port()
        if p not in ports:
            ports.append(p)
    usage_dir = tmp / "device_usage"
    usage_dir.mkdir()
    env = child_env(standin_plugin_dir, None, {"STANDIN_GCU_USAGE_DIR": usage_dir})
    handle = launcher.start_server(repo, *ports, model_dir=gcu_tiny_model_dir, log_path=log_path, env=env,
                                   python_bin=stub_venv_bin)
    try:
        try:
            handle.wait_ready(timeout=READY_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as e:
            pytest.fail(f"tritonserver on the stand-in gcu did not start: {e}\n{handle.log_tail(60)}", pytrace=False)
        from types import SimpleNamespace

        yield SimpleNamespace(grpc_url=f"127.0.0.1:{ports[1]}", metrics_url=f"http://127.0.0.1:{ports[2]}/metrics",
                              log_path=log_path, handle=handle, usage_dir=usage_dir)
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def cpu_reference(gcu_tiny_model_dir) -> dict[str, str]:
    """prompt -> CPU greedy text from the same engine code (a child process, no plug-in)."""
    run = run_child({"action": "generate", "text_prompts": PROMPTS, "max_tokens": MAX_TOKENS,
                     "engine": engine_kwargs(gcu_tiny_model_dir, device="cpu")}, None)
    r = run.ok()
    assert r["device"] == "cpu" and all(len(t) == MAX_TOKENS for t in r["tokens"])
    return dict(zip(PROMPTS, r["texts"]))


def per_instance(m, name, **labels) -> dict:
    return {inst: m.value(name, model="llm", version="1", instance=inst, **labels) for inst in INSTANCES}


def _config_lines(log: str) -> dict[str, tuple[str, int]]:
    """instance -> (device setting, device_id) from its logged EngineConfig."""
    found = {}
    for inst in INSTANCES:
        m = re.search(rf"llm instance {inst}: EngineConfig\(.*?device='([^']*)'.*?device_id=(\d+)", log)
        if m:
            found[inst] = (m.group(1), int(m.group(2)))
    return found


def _stub_memory(handle, usage_dir: Path) -> dict[str, dict[str, int]]:
    """instance -> {device: bytes in use} for each llm stub process, read from the plug-in's usage
    file of that process (STANDIN_GCU_USAGE_DIR). The stub's argv names its instance (llm_0_0 ...)."""
    out = {}
    for pid in handle._stubs:  # the server's stub processes, recorded at ready
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        names = [a.decode() for a in argv if a.decode() in INSTANCES]
        usage = usage_dir / f"standin_gcu.{pid}.txt"
        if not names or not usage.is_file():
            continue
        used = {}
        for line in usage.read_text().splitlines():
            dev, _, n, _, _peak = line.split()
            used[dev] = int(n)
        out[names[0]] = used
    return out


def test_two_instances_each_on_its_own_gcu(gcu_server, gcu_tiny_model_dir):
    from clients import scrape_metrics

    log = gcu_server.log_path.read_text(errors="replace")
    assert _config_lines(log) == {"llm_0_0": ("auto", 0), "llm_0_1": ("auto", 1)}, _config_lines(log)
    ready = re.findall(r"engine ready on (gcu:\d+|cpu)", log)
    assert sorted(ready) == ["gcu:0", "gcu:1"], ready
    for dev in ("gcu:0", "gcu:1"):  # the platform layer names the stand-in for each device
        assert re.search(rf"platform {dev}: .*stand-in.*not an Enflame GCU", log, re.I), f"no stand-in line for {dev}"
    # Log lines carry no instance name: which device each stub process really uses comes from the
    # plug-in's own accounting in that process.
    weights = (Path(gcu_tiny_model_dir) / "model.safetensors").stat().st_size * 0.9
    mem = _stub_memory(gcu_server.handle, gcu_server.usage_dir)
    assert set(mem) == set(INSTANCES), mem
    for k, inst in enumerate(INSTANCES):
        assert mem[inst][f"gcu:{k}"] >= weights, (inst, mem[inst])
        assert mem[inst][f"gcu:{1 - k}"] == 0, (inst, mem[inst])
    m = scrape_metrics(gcu_server.metrics_url)
    assert per_instance(m, "llm_kv_cache_free_blocks") == {inst: 64 for inst in INSTANCES}
    assert per_instance(m, "llm_engine_healthy") == {inst: 1 for inst in INSTANCES}
    # each instance names its device: in the log line with its instance name, and on llm_engine_info
    for k, inst in enumerate(INSTANCES):
        assert re.search(rf"llm instance {inst}: serving on gcu:{k} \(dtype float32, ", log), inst
        info = m.find("llm_engine_info", model="llm", instance=inst)
        assert len(info) == 1 and info[0][1] == 1, info
        assert info[0][0]["device"] == f"gcu:{k}" and info[0][0]["dtype"] == "float32", info
        assert "cpu_kernels" not in info[0][0]["kernels"], info  # the C++ CPU kernels never serve a gcu place


def test_concurrent_requests_reach_both_instances_with_cpu_greedy_text(gcu_server, cpu_reference):
    from clients import llm_stream, run_concurrently, scrape_metrics
    from metrics_util import is_idle, wait_for

    before = per_instance(scrape_metrics(gcu_server.metrics_url), "llm_requests_total", finish_reason="length")
    grown, rounds = {}, 0
    for rounds in range(1, 7):  # rounds of concurrent requests until both instances have served
        results = run_concurrently(
            [lambda p=p: llm_stream(gcu_server.grpc_url, p, stream=False, sampling_parameters=SAMPLING,
                                    exclude_input_in_output=True, timeout=300).raise_for_error()
             for p in PROMPTS], timeout=600)
        for p, res in zip(PROMPTS, results):
            assert res.text == cpu_reference[p], (p, res.text, cpu_reference[p])
        after = wait_for(gcu_server.metrics_url, is_idle, timeout=120)[0]
        now = per_instance(after, "llm_requests_total", finish_reason="length")
        grown = {inst: now[inst] - before[inst] for inst in INSTANCES}
        if all(v > 0 for v in grown.values()):
            break
    assert all(v > 0 for v in grown.values()), f"requests finished per instance after {rounds} rounds: {grown}"
    assert sum(grown.values()) == rounds * len(PROMPTS)
    tokens = per_instance(after, "llm_generation_tokens_total")
    assert all(v >= MAX_TOKENS for v in tokens.values()), tokens
