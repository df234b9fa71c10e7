"""The engine's GCU code path on the stand-in `gcu` plug-in (host memory; NOT an Enflame GCU).

Each test runs its Paddle work in child processes (conftest.run_child): the plug-in loads, device
detection, greedy tokens on gcu:0 equal to CPU, KV sizing from the device's reported memory, a clear
error when the KV cache does not fit the device, and the plug-in version check at start-up.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from gcu_helpers import BLOCK, engine_kwargs

MIB = 1 << 20


def prompts_of_lengths(lengths) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(100, 40000, size=n).tolist() for n in lengths]


def kv_bytes_per_block(model_dir: str, dtype_bytes: int = 4) -> int:
    """K and V of every layer for one block, from config.json alone."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * BLOCK * c["num_key_value_heads"] * head_dim * dtype_bytes


def weight_bytes(model_dir: str) -> int:
    from safetensors import safe_open

    n = 0
    with safe_open(str(Path(model_dir) / "model.safetensors"), framework="numpy") as f:
        for k in f.keys():
            n += f.get_tensor(k).nbytes
    return n


# -- the build ----------------------------------------------------------------------------------------
def test_plugin_build_is_cached_and_a_compile_error_carries_the_compiler_text(standin_plugin_dir, tmp_path):
    import time

    from gcu_helpers import standin_build

    t0 = time.monotonic()
    again = standin_build.build_plugin()
    assert again == standin_plugin_dir and time.monotonic() - t0 < 2.0  # cached by source hash
    assert [p.name for p in again.iterdir()] == [standin_build.LIB_NAME]  # CUSTOM_DEVICE_ROOT loads every *.so
    bad = tmp_path / "bad.cc"
    bad.write_text('#include "paddle/phi/backends/device_ext.h"\nvoid InitPlugin(CustomRuntimeParams* p) { oops; }\n')
    with pytest.raises(standin_build.PluginBuildError) as e:
        standin_build.build_plugin(build_root=tmp_path / "b", source=bad)
    text = str(e.value)  # the compiler's own diagnostic (its quotes depend on the locale)
    assert "oops" in text and "was not declared" in text and "bad.cc" in text
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


# -- a. the plug-in itself -------------------------------------------------------------------------
def test_plugin_loads_two_devices_exact_round_trip_and_accounted_memory(child, standin_plugin_dir):
    total_mb = 512
    run = child({"action": "probe", "oom_bytes": (total_mb + 1) * MIB}, standin_plugin_dir,
                env={"FLAGS_use_stride_kernel": "0", "STANDIN_GCU_TOTAL_MEMORY_MB": total_mb})
    r = run.ok()
    assert r["custom_types"] == ["gcu"]
    assert r["available"] == ["gcu:0", "gcu:1"]
    assert r["default_device"] == "gcu:0"  # why nothing here may load it into the pytest process
    assert [p["total_memory"] for p in r["properties"]] == [total_mb * MIB] * 2
    assert all("not an Enflame GCU" in p["name"] for p in r["properties"])
    assert r["plugin_total"] == total_mb * MIB
    # Paddle's public API refuses custom devices; the engine must use core.get_device_properties
    assert r["public_properties_api"] != "works"
    assert r["places"] == ["Place(gcu:0)", "Place(gcu:1)"]
    assert r["roundtrip_exact"] and r["matmul_close"]
    nbytes = r["tensor_bytes"]
    assert r["allocated_before"] == {"gcu:0": 0, "gcu:1": 0}
    a0, a1 = r["allocated_after_gcu0"], r["allocated_after_gcu1"]
    assert nbytes <= a0["gcu:0"] < nbytes + 64 * 1024 and a0["gcu:1"] == 0  # counted on its own device
    assert a1["gcu:0"] == a0["gcu:0"] and nbytes <= a1["gcu:1"] < nbytes + 64 * 1024
    assert r["plugin_used"][1] >= nbytes and r["plugin_used"][0] >= a0["gcu:0"]
    # one byte past the device's total cannot be allocated
    assert r["oom"] is not None and r["oom"]["type"] == "OSError"
    assert "CustomDevice error" in r["oom"]["message"]
    assert "out of memory on gcu:0" in run.stderr  # the plug-in's own line


# -- b. device detection -------------------------------------------------------------------------------
def test_auto_device_is_gcu_with_the_plugin_and_cpu_without(child, standin_plugin_dir, standin_package):
    cases = [["auto", 0], ["auto", 1], ["gcu", 1], ["gcu:1", 0], ["cpu", 0]]
    with_plugin = child({"action": "resolve", "cases": cases}, standin_plugin_dir, standin_package).ok()
    assert with_plugin["results"] == ["gcu:0", "gcu:1", "gcu:1", "gcu:1", "cpu"]
    # the package installed but its plug-in not loaded (a driver or runtime fault): auto refuses as gcu
    # does, naming the versions, instead of serving a GCU host on its CPU
    not_loaded = child({"action": "resolve", "cases": cases}, None, standin_package).ok()
    assert not_loaded["results"][4] == "cpu"
    for r in not_loaded["results"][:4]:
        assert isinstance(r, dict) and "did not load" in r["error"]["message"], r
        assert "paddle-custom-gcu 3.3.1+standin" in r["error"]["message"]
    # neither the package nor the plug-in: a CPU host; auto is the CPU, an explicit gcu is refused
    without = child({"action": "resolve", "cases": cases}, None).ok()
    assert without["results"][:2] == ["cpu", "cpu"]
    assert without["results"][4] == "cpu"
    for r in without["results"][2:4]:
        assert isinstance(r, dict) and "not installed" in r["error"]["message"], r


# -- c. greedy tokens on gcu:0 equal CPU -----------------------------------------------------------------
def test_engine_on_gcu_gives_cpu_greedy_tokens(child, standin_plugin_dir, standin_package, gcu_tiny_model_dir):
    prompts = prompts_of_lengths([3, 17, 40, 70, 1])
    spec = {"action": "generate", "prompts": prompts, "max_tokens": 12}
    cpu = child({**spec, "engine": engine_kwargs(gcu_tiny_model_dir, device="cpu")}, None).ok()
    gcu = child({**spec, "engine": engine_kwargs(gcu_tiny_model_dir, device="auto")},
                standin_plugin_dir, standin_package)
    g = gcu.ok()
    assert cpu["device"] == "cpu" and cpu["platform_class"] == "CpuPlatform"
    assert g["device"] == "gcu:0" and g["platform_class"] == "GcuPlatform"
    assert all(len(t) == 12 for t in cpu["tokens"])
    assert g["tokens"] == cpu["tokens"]
    assert g["texts"] == cpu["texts"]
    # the engine says in its log that this is the stand-in, not a GCU
    assert re.search(r"stand-in", gcu.stderr, re.I) and "not an Enflame GCU" in gcu.stderr
    # the child's env has no FLAGS_use_stride_kernel: the engine decides it for the place, and says so
    assert "FLAGS_use_stride_kernel" in gcu.stderr
    # the KV cache and the weights live on gcu:0, nothing on gcu:1
    assert g["plugin_used_after_start"] >= 64 * kv_bytes_per_block(gcu_tiny_model_dir)
    assert g["plugin_used_other_device"] == 0


# -- d. KV sizing from the device's memory ---------------------------------------------------------------
@pytest.mark.parametrize("device_id", [0, 1])
def test_kv_blocks_from_memory_fraction_of_the_reported_total(child, standin_plugin_dir, standin_package,
                                                              gcu_tiny_model_dir, device_id):
    total_mb, frac = 256, 0.5
    run = child({"action": "start", "engine": engine_kwargs(gcu_tiny_model_dir, device="auto", device_id=device_id,
                                                            num_kv_blocks=0, kv_cache_memory_fraction=frac)},
                standin_plugin_dir, standin_package, env={"STANDIN_GCU_TOTAL_MEMORY_MB": total_mb})
    r = run.ok()
    assert r["device"] == f"gcu:{device_id}" and r["platform_class"] == "GcuPlatform"
    bpb = kv_bytes_per_block(gcu_tiny_model_dir)
    assert r["kv_dtype"] == "float32" and r["kv_bytes_per_block"] == bpb
    assert "reserved_before_kv" in r, "gcu_child could not hook Worker._allocate_kv_cache (renamed?)"
    reserved = r["reserved_before_kv"]  # read on the device just before the KV cache was allocated
    assert reserved == r["plugin_used_before_kv"]  # Paddle's count is the plug-in's count
    assert weight_bytes(gcu_tiny_model_dir) <= reserved < weight_bytes(gcu_tiny_model_dir) + 16 * MIB
    expected = math.floor(frac * (total_mb * MIB - reserved) / bpb)
    assert r["num_kv_blocks"] == expected, (r, expected)
    # the cache really is on that device, and only there
    assert r["plugin_used_after_start"] >= reserved + expected * bpb
    assert r["plugin_used_other_device"] == 0
    assert "free memory unknown" not in run.stderr  # sized from the device, not the fixed fallback


# -- e. out of device memory -----------------------------------------------------------------------------
@pytest.mark.parametrize("setting", ["num_kv_blocks", "kv_cache_memory_bytes"])
def test_kv_cache_larger_than_the_device_fails_start_up_naming_the_setting(
        child, standin_plugin_dir, standin_package, gcu_tiny_model_dir, setting):
    total_mb = 96
    kw = {"num_kv_blocks": 200_000} if setting == "num_kv_blocks" else \
        {"num_kv_blocks": 0, "kv_cache_memory_bytes": 1 << 30}
    run = child({"action": "start", "engine": engine_kwargs(gcu_tiny_model_dir, **kw)}, standin_plugin_dir,
                standin_package, env={"STANDIN_GCU_TOTAL_MEMORY_MB": total_mb})
    err = run.error
    assert err is not None, f"engine started with a KV cache larger than the {total_mb} MiB device: {run.result}"
    msg = err["message"]
    assert setting in msg, msg
    assert "gcu:0" in msg, msg
    assert not msg.lstrip().startswith("(External)"), msg  # not Paddle's raw CustomDevice error
    assert re.search(r"kv_cache_memory_fraction|kv_cache_memory_bytes|num_kv_blocks", msg)


# -- f. plug-in version check ------------------------------------------------------------------------------
def test_matching_plugin_version_starts_and_a_mismatch_is_refused(child, standin_plugin_dir, standin_package_factory,
                                                                  gcu_tiny_model_dir):
    import importlib.metadata as md

    paddle_version = md.version("paddlepaddle")
    good = f"{paddle_version}+standin"
    ok = child({"action": "start", "engine": engine_kwargs(gcu_tiny_model_dir)}, standin_plugin_dir,
               standin_package_factory(good))
    assert ok.ok()["device"] == "gcu:0"
    assert good in ok.stderr  # the plug-in version is logged at start-up
    major, minor = (int(x) for x in paddle_version.split(".")[:2])
    bad = f"{major}.{minor - 2 if minor >= 2 else minor + 2}.0+standin"
    refused = child({"action": "start", "engine": engine_kwargs(gcu_tiny_model_dir)}, standin_plugin_dir,
                    standin_package_factory(bad))
    assert refused.error is not None, "a mismatching plug-in version was accepted"
    assert refused.error["type"] == "PlatformError"
    assert bad in refused.error["message"] and paddle_version in refused.error["message"]
    missing = child({"action": "start", "engine": engine_kwargs(gcu_tiny_model_dir)}, standin_plugin_dir, None)
    assert missing.error is not None and "paddle-custom-gcu" in missing.error["message"]
    assert "not installed" in missing.error["message"]
