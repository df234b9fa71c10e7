"""The engine's GCU step through paddle-custom-gcu's fast custom ops, on the stand-in `gcu` plug-in
(tests/gcu_standin: plain C++ reference kernels on host memory registered under the real ops' names,
input orders, attributes and in-place maps; NOT an Enflame GCU).

Each engine runs in a child process (gcu_kernels_child.py) with a hard timeout. Checked:
- with every op on (gcu_attention, gcu_rotary, gcu_rms_norm), the engine on gcu:0 gives CPU's greedy
  tokens (fp32) over a schedule with mixed prefill/decode steps, chunked prefill, prefix-cache hits
  and n > 1 (copy on write of the paged "blocks" cache), and under preemption;
- the stand-in's call log of one mixed step: per decoder layer fused rotary, the paged KV write,
  exactly ONE flash_attn_var_len_gcu over every token of the step, the fused norms; no composed KV
  gather and no softmax ran during the step;
- a stand-in build with a stub rms_norm_gcu and a flash_attn_var_len_gcu of another signature: the
  plan turns gcu_rms_norm (its check fails) and gcu_attention (signature, both named) off, and the
  tokens still equal CPU's;
- mixture of experts (Qwen3-MoE: q/k norm before the fused rotary, plain softmax top-k through
  topk_softmax_gcu; ERNIE 4.5 MoE: interleaved rotary permuted at load, routing with a correction
  bias kept composed) through the fused MoE trio, tokens equal to HF's;
- tensor parallelism over gcu:0 / gcu:1 (Paddle's xccl backend over the stand-in's xccl_* callbacks,
  tests/gcu_standin/standin_xccl.cc: shared memory between the rank processes): the TP=2 engine with
  every GCU op on gives CPU TP=1's greedy tokens over the mixed schedule (n = 2 included), each rank
  running the sharded heads and the all-reduces going through the plug-in; the collectives
  themselves (dtypes, reduce ops, chunked sizes) equal numpy, and a rank whose peer is silent or
  dead gets an error in bounded time instead of hanging; no shared-memory segment is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gcu_helpers import BLOCK, child_env, engine_kwargs, standin_build, tail

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHILD = HERE / "gcu_kernels_child.py"
MARK = "GCU_CHILD_RESULT "
TIMEOUT_S = 420.0
GCU_KERNELS = ("gcu_attention", "gcu_rotary", "gcu_rms_norm")
REF_DIR = REPO / "tests" / "reference"  # fixtures/


def run(spec: dict, plugin_dir: Path | None, package_dir: Path | None, env: dict | None = None) -> tuple[dict, str]:
    """Run gcu_kernels_child.py with `spec`; (its result, its stderr). Fails the test on a timeout
    or an error in the child (with the child's log tail)."""
    proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)], env=child_env(plugin_dir, package_dir, env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=str(REPO))
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"child did not finish within {TIMEOUT_S:.0f} s\n{tail(err)}", pytrace=False)
    lines = [line for line in out.splitlines() if line.startswith(MARK)]
    if not lines:
        pytest.fail(f"child exited with code {proc.returncode} without a result\n{tail(out)}\n{tail(err)}", pytrace=False)
    result = json.loads(lines[-1][len(MARK):])
    if result.get("error"):
        pytest.fail(f"child raised {result['error']['type']}: {result['error']['message']}\n{tail(err)}", pytrace=False)
    return result, err


def prompt(n: int, salt: int) -> list[int]:
    return np.random.default_rng(100 + salt).integers(100, 40000, size=n).tolist()


def mixed_schedule() -> list[dict]:
    """Requests joining while others decode (mixed steps), prompts longer than the step's token
    budget (chunked prefill), a prompt that shares two full blocks with an earlier one (prefix-cache
    hit: its first chunk starts at position 32), and n = 2 (the forked sequences copy the partial
    prompt block on write)."""
    base = prompt(40, 0)
    return [
        {"id": "long", "prompt": base, "max_tokens": 10},
        {"id": "twins", "prompt": prompt(5, 1), "max_tokens": 8, "n": 2},
        {"id": "chunked", "prompt": prompt(70, 2), "max_tokens": 6, "at_step": 2},
        {"id": "prefix", "prompt": base[:2 * BLOCK] + prompt(9, 3), "max_tokens": 8, "at_step": 5},
    ]


def mixed_engine(model_dir: str, **kw) -> dict:
    return engine_kwargs(model_dir, max_num_batched_tokens=32, enable_prefix_caching=1, **kw)


@pytest.fixture(scope="module")
def cpu_mixed(gcu_tiny_model_dir):
    res, _ = run({"engine": mixed_engine(gcu_tiny_model_dir, device="cpu"), "requests": mixed_schedule()}, None, None)
    return res


@pytest.fixture(scope="module")
def gcu_mixed(standin_plugin_dir, standin_package, gcu_tiny_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("calllog") / "calls.log"
    res, err = run({"engine": mixed_engine(gcu_tiny_model_dir), "requests": mixed_schedule()}, standin_plugin_dir,
                   standin_package, env={"STANDIN_GCU_CALL_LOG": log})
    return res, err


def test_every_gcu_op_gives_cpu_greedy_tokens_on_mixed_chunked_prefix_and_n_steps(cpu_mixed, gcu_mixed):
    g, err = gcu_mixed
    assert g["device"] == "gcu:0" and g["dtype"] == "float32"
    assert all(g["kernels"][k] for k in GCU_KERNELS), g["decisions"]
    assert g["kv_layout"] == "blocks" and g["attention_metadata"] == "flash"
    assert g["kv_shape"][0] == 64 and g["kv_shape"][1] == BLOCK  # [num_blocks, block_size, kv_heads, head_dim]
    assert g["names"]["attention"] == "flash_attn_var_len_gcu" and g["names"]["rms_norm"] == "rms_norm_gcu"
    # the schedule really had what it is meant to cover, on both places
    for r in (g, cpu_mixed):
        assert r["prefix_hit_tokens"] >= 2 * BLOCK and r["cow_copies"] >= 1
    assert g["tokens"] == cpu_mixed["tokens"]
    assert len(g["tokens"]["twins"]) == 2 and g["tokens"]["twins"][0] == g["tokens"]["twins"][1]
    assert [len(t) for t in g["tokens"]["long"]] == [10]
    for kernel in GCU_KERNELS:
        assert f"platform gcu:0: {kernel}: on, the gcu plug-in registers" in err


def layer_calls(step: dict) -> list[str]:
    return [line.split(" [")[0] for line in step["log"]]


def test_call_log_of_a_mixed_step_has_one_flash_attention_per_layer_and_no_composed_gather(gcu_mixed):
    g, _ = gcu_mixed
    step = g["mixed_step"]
    assert step is not None and step["decodes"] >= 1 and step["chunks"], "the schedule made no mixed step"
    assert any(start > 0 for start, _ in step["chunks"])  # a chunk continuing cached keys joins the decodes
    tokens = step["decodes"] + sum(n for _, n in step["chunks"])
    per_layer = ["fused_rotary_embedding_gcu", "reshape_and_cache_flash_gcu", "flash_attn_var_len_gcu",
                 "fused_add_rms_norm_op", "fused_add_rms_norm_op"]
    assert layer_calls(step) == ["rms_norm_gcu"] + per_layer * g["num_layers"], step["log"]
    flash = [line for line in step["log"] if line.startswith("flash_attn_var_len_gcu")]
    assert len(flash) == g["num_layers"]  # exactly one per layer, over every token of the step
    assert all(line.startswith(f"flash_attn_var_len_gcu [{tokens}, ") for line in flash), flash
    assert step["gathers"] == 0 and step["softmaxes"] == 0


def test_preemption_on_gcu_gives_cpu_tokens(child, standin_plugin_dir, standin_package, gcu_tiny_model_dir):
    reqs = [{"id": f"p{i}", "prompt": prompt(30 + 7 * i, 10 + i), "max_tokens": 40} for i in range(3)]
    kw = dict(num_kv_blocks=9, max_model_len=96)
    cpu, _ = run({"engine": engine_kwargs(gcu_tiny_model_dir, device="cpu", **kw), "requests": reqs}, None, None)
    g, _ = run({"engine": engine_kwargs(gcu_tiny_model_dir, **kw), "requests": reqs}, standin_plugin_dir,
               standin_package)
    assert g["kv_layout"] == "blocks" and g["preemptions"] > 0 and cpu["preemptions"] > 0
    assert g["tokens"] == cpu["tokens"]


def test_broken_plugin_turns_its_kernels_off_with_the_reason_and_keeps_cpu_tokens(cpu_mixed, standin_package,
                                                                                  gcu_tiny_model_dir):
    try:
        broken = standin_build.build_plugin(variant="broken")
    except standin_build.PluginBuildError as e:
        pytest.fail(str(e), pytrace=False)
    g, err = run({"engine": mixed_engine(gcu_tiny_model_dir), "requests": mixed_schedule()}, broken, standin_package)
    assert g["kernels"]["gcu_attention"] is False and g["kernels"]["gcu_rms_norm"] is False
    assert g["kernels"]["gcu_rotary"] is True  # what is right in the broken build stays on
    text = "\n".join(g["decisions"])
    attn = next(d for d in g["decisions"] if d.startswith("gcu_attention: off"))
    assert "flash_attn_var_len_gcu signature differs: registered" in attn and "head_size: int" in attn
    assert "softcap: float" in attn  # the expected signature is named too
    assert "gcu_rms_norm: off, verification failed" in text
    assert g["kv_layout"] == "heads_slots" and g["names"]["attention"] == "composed"
    assert g["tokens"] == cpu_mixed["tokens"]
    assert "platform gcu:0: gcu_attention: off" in err


@pytest.mark.parametrize("family", ["qwen3_moe", "ernie4_5_moe"])
def test_moe_through_the_fused_trio_gives_hf_tokens(family, standin_plugin_dir, standin_package, tmp_path):
    import tiny_checkpoints as tc

    ref = np.load(REF_DIR / "fixtures" / f"tiny_{family}.npz")
    model_dir = str(tc.make_checkpoint(family, tmp_path))
    prompts = tc.prompts()
    reqs = [{"id": f"m{i}", "prompt": p, "max_tokens": 8, "at_step": i} for i, p in enumerate(prompts)]
    g, err = run({"engine": engine_kwargs(model_dir), "requests": reqs}, standin_plugin_dir, standin_package)
    assert g["kernels"]["fused_moe"] is True, g["decisions"]
    assert all(g["kernels"][k] for k in GCU_KERNELS), g["decisions"]
    assert g["names"]["moe_experts"] == "fused_gcu"
    want = [ref["output_ids"][i, :8].tolist() for i in range(len(prompts))]
    assert [g["tokens"][f"m{i}"][0] for i in range(len(prompts))] == want


def xccl_segments() -> set[str]:
    """The stand-in's communicator segments in /dev/shm (each is unlinked once its ranks attached)."""
    return {p.name for p in Path("/dev/shm").glob("standin_gcu_xccl.*")}


def test_tp2_on_gcu0_gcu1_through_the_standin_collectives_gives_cpu_tokens(cpu_mixed, standin_plugin_dir,
                                                                          standin_package, gcu_tiny_model_dir,
                                                                          tmp_path):
    """TP=2 over gcu:0 / gcu:1, every GCU op on, over the mixed schedule (chunked prefill, a
    prefix-cache hit, n = 2): CPU TP=1's greedy tokens. The call log (both ranks write it) shows
    each rank's flash attention over its half of the heads and, per step and rank, one all-reduce
    of the embedding plus two per layer (o_proj, MLP), all through the plug-in's xccl_all_reduce."""
    log, before, t0 = tmp_path / "calls.log", xccl_segments(), time.monotonic()
    g, err = run({"engine": mixed_engine(gcu_tiny_model_dir, tensor_parallel_size=2), "requests": mixed_schedule()},
                 standin_plugin_dir, standin_package, env={"STANDIN_GCU_CALL_LOG": log})
    elapsed = time.monotonic() - t0
    assert "tensor parallel: 2 workers on gcu:0, gcu:1 ready" in err, tail(err)
    for kernel in GCU_KERNELS:  # each rank decided (and checked) its kernels on its own device
        assert err.count(f"{kernel}: on, the gcu plug-in registers") == 2, tail(err)
    assert g["tokens"] == cpu_mixed["tokens"]
    assert len(g["tokens"]["twins"]) == 2 and g["prefix_hit_tokens"] >= 2 * BLOCK
    cfg = json.loads((Path(gcu_tiny_model_dir) / "config.json").read_text())
    heads, layers, hidden = cfg["num_attention_heads"], cfg["num_hidden_layers"], cfg["hidden_size"]
    calls = log.read_text().splitlines()
    assert calls.count("xccl_comm_init_rank [2]") == 2  # one communicator, both ranks joined it
    reduces = [int(line.split("[")[1].rstrip("]")) for line in calls if line.startswith("xccl_all_reduce [")]
    assert len(reduces) == 2 * g["steps"] * (1 + 2 * layers)
    assert all(n % hidden == 0 for n in reduces)  # [tokens, hidden] activations
    steps = calls[calls.index("xccl_comm_init_rank [2]"):]  # before: each rank's start-up kernel checks
    flash = [line for line in steps if line.startswith("flash_attn_var_len_gcu [")]
    assert flash and all(line.endswith(f", {heads // 2}, {cfg['head_dim']}]") for line in flash), flash[:4]
    assert xccl_segments() <= before  # every communicator's segment was unlinked
    print(f"TP=2 engine on the stand-in: {elapsed:.1f} s, {g['steps']} steps, {len(reduces)} all-reduces")


def run_ranks(plugin_dir: Path, package_dir: Path, log: Path, exit_early: bool = False,
              timeout: float = 180.0) -> list[dict]:
    """gcu_kernels_child.py's collectives scenario on ranks 0 and 1 at once; their results in rank
    order (the last rank is reaped first: a rank that left early is then gone, not a zombie)."""
    with socket.socket() as s:  # the ranks' rendezvous port (rank r also names port + r)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(CHILD), json.dumps(
        {"collectives": {"rank": r, "size": 2, "port": port, "exit_early": exit_early}})],
        env=child_env(plugin_dir, package_dir, {"STANDIN_GCU_CALL_LOG": log, "STANDIN_GCU_XCCL_TIMEOUT_S": 60}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=str(REPO))
        for r in range(2)]
    outs = {}
    try:
        for r in (1, 0):
            outs[r] = procs[r].communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        pytest.fail(f"the collective ranks did not finish within {timeout:.0f} s", pytrace=False)
    results = []
    for r in range(2):
        out, err = outs[r]
        lines = [line for line in out.splitlines() if line.startswith(MARK)]
        if exit_early and r == 1:
            assert not lines and procs[r].returncode == 0
            continue
        assert lines, f"rank {r} exited with code {procs[r].returncode} without a result\n{tail(err)}"
        results.append(dict(json.loads(lines[-1][len(MARK):]), stderr=err))
        assert not results[-1].get("error"), (results[-1]["error"], tail(err))
    return results


def test_standin_collectives_equal_numpy_and_a_silent_or_dead_peer_fails_in_bounded_time(standin_plugin_dir,
                                                                                          standin_package, tmp_path):
    """all_reduce (float32 / float64 / bf16 / fp16 / int64 / int32 / int8 sums; float32 max, min,
    prod), broadcast, reduce, all_gather and reduce_scatter between two rank processes equal numpy
    exactly (two-rank sums are exact in the tested dtypes), the largest ones in chunks. Then rank 1
    stays alive but silent: rank 0's all_reduce on a second communicator (new_group) times out after
    its 1 s bound; rank 1 then exits: rank 0's all_reduce on the world communicator fails as soon as
    the peer is gone (60 s bound), and the next one at once. No segment is left in /dev/shm."""
    log, before = tmp_path / "calls.log", xccl_segments()
    ranks = run_ranks(standin_plugin_dir, standin_package, log, exit_early=True)
    checks = ranks[0]["checks"]
    assert len(checks) == 14, sorted(checks)
    assert {k: v for k, v in checks.items() if v != 0.0} == {}
    lines = log.read_text().splitlines()
    calls = {line.split(" [")[0] for line in lines}
    assert {"xccl_get_unique_id", "xccl_comm_init_rank", "xccl_all_reduce", "xccl_broadcast", "xccl_reduce",
            "xccl_all_gather", "xccl_reduce_scatter"} <= calls
    assert lines.count("xccl_comm_init_rank [2]") == 4  # the world group's and the new group's, per rank
    silent, t_silent = ranks[0]["silent_peer"]
    assert "CustomDevice error" in silent and 0.9 < t_silent < 5.0, (silent, t_silent)
    (dead, t_dead), (again, t_again) = ranks[0]["dead_peer"]
    assert "CustomDevice error" in dead and t_dead < 15.0, (dead, t_dead)
    assert "CustomDevice error" in again and t_again < 1.0, (again, t_again)
    err = ranks[0]["stderr"]
    assert "timed out (STANDIN_GCU_XCCL_TIMEOUT_S)" in err and "a peer rank's process is gone (dead rank 1)" in err
    assert xccl_segments() <= before
