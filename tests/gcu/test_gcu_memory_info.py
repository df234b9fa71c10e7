"""KV sizing on a GCU from the device's free memory as the TOPS runtime reports it
(platforms/tops_runtime.py: topsMemGetInfo through ctypes), with a fake libtopsrt.so built here by
gcc that reports figures the test chooses; without the library, the fallback to the plug-in's
total minus Paddle's reserved, with the KV log line naming the source either way. The engine runs
on the stand-in gcu:0 / gcu:1 (host memory, NOT an Enflame GCU) in child processes."""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gcu_helpers import engine_kwargs
from paddle_llm_engine.platforms import tops_runtime
from test_gcu_standin import kv_bytes_per_block

MIB = 1 << 20
BASE_FREE = 24 * MIB  # device 0's free figure; device d reports BASE_FREE + d * 8 MiB
TOTAL = 64 * 1024 * MIB

# The TOPS runtime's calls the engine makes (TopsRider tops_runtime_api.h), reporting fixed figures
# per device; FAKE_TOPS_FAIL=1 makes topsMemGetInfo return an error (topsErrorInvalidValue, 1).
FAKE_TOPSRT = r"""
#include <stddef.h>
#include <stdlib.h>
static int current = 0;
int topsSetDevice(int id) { if (id < 0 || id > 1) return 101; current = id; return 0; }
int topsGetDevice(int* id) { *id = current; return 0; }
int topsMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const char* fail = getenv("FAKE_TOPS_FAIL");
  if (fail && fail[0] == '1') return 1;
  *free_bytes = (size_t)BASE_FREE + (size_t)current * (8u << 20);
  *total_bytes = (size_t)TOTAL;
  return 0;
}
"""


@pytest.fixture(scope="module")
def fake_topsrt(tmp_path_factory) -> Path:
    """A folder holding libtopsrt.so (the fake above), built with gcc."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.fail("no C compiler (gcc) to build the fake libtopsrt.so", pytrace=False)
    folder = tmp_path_factory.mktemp("fake_tops")
    src = folder / "fake_topsrt.c"
    src.write_text(FAKE_TOPSRT)
    subprocess.run([gcc, "-O1", "-fPIC", "-shared", f"-DBASE_FREE={BASE_FREE}", f"-DTOTAL={TOTAL}", "-o",
                    str(folder / "libtopsrt.so"), str(src)], check=True, capture_output=True, text=True)
    return folder


@pytest.fixture
def fresh_runtime(monkeypatch):
    tops_runtime._load.cache_clear()
    yield monkeypatch
    tops_runtime._load.cache_clear()


def test_mem_get_info_through_the_library_setting(fake_topsrt, fresh_runtime):
    fresh_runtime.setenv(tops_runtime.LIBRARY_ENV, str(fake_topsrt / "libtopsrt.so"))
    assert tops_runtime.mem_get_info(0) == (BASE_FREE, TOTAL)
    assert tops_runtime.mem_get_info(1) == (BASE_FREE + 8 * MIB, TOTAL)
    info, where = tops_runtime.query(0)
    assert where == f"topsMemGetInfo in {fake_topsrt / 'libtopsrt.so'}"
    lib, _ = tops_runtime.runtime_library()
    dev = ctypes.c_int(-1)
    lib.topsSetDevice(1)
    tops_runtime.query(0)
    lib.topsGetDevice(ctypes.byref(dev))
    assert dev.value == 1  # the thread's current device is restored
    assert tops_runtime.query(7) == (None, f"topsSetDevice(7) in {fake_topsrt / 'libtopsrt.so'} returned error 101")
    fresh_runtime.setenv("FAKE_TOPS_FAIL", "1")
    assert tops_runtime.mem_get_info(0) is None
    assert tops_runtime.query(0)[1].endswith("returned error 1")


def test_without_the_library_there_is_no_figure_and_the_reason(tmp_path, fresh_runtime):
    fresh_runtime.setenv(tops_runtime.LIBRARY_ENV, str(tmp_path / "nowhere" / "libtopsrt.so"))
    info, why = tops_runtime.query(0)
    assert info is None and why.startswith("the TOPS runtime did not load (") and "nowhere/libtopsrt.so" in why
    fresh_runtime.setenv(tops_runtime.LIBRARY_ENV, "libm.so.6")  # loads, but is not the TOPS runtime
    info, why = tops_runtime.query(0)
    assert info is None and "topsMemGetInfo" in why


def _kv_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "KV cache:" in line]
    assert lines, stderr[-3000:]
    return lines[-1]


@pytest.mark.parametrize("how, device_id", [("setting", 0), ("LD_LIBRARY_PATH", 1)])
def test_engine_sizes_its_kv_cache_from_the_tops_runtime(child, standin_plugin_dir, standin_package, gcu_tiny_model_dir,
                                                         fake_topsrt, how, device_id):
    frac = 0.5
    env = {"STANDIN_GCU_TOTAL_MEMORY_MB": 256}
    if how == "setting":
        env[tops_runtime.LIBRARY_ENV] = str(fake_topsrt / "libtopsrt.so")
    else:  # the loader's own search finds "libtopsrt.so"
        env["LD_LIBRARY_PATH"] = str(fake_topsrt)
    run = child({"action": "start", "engine": engine_kwargs(gcu_tiny_model_dir, device_id=device_id, num_kv_blocks=0,
                                                            kv_cache_memory_fraction=frac)},
                standin_plugin_dir, standin_package, env=env)
    r = run.ok()
    assert r["device"] == f"gcu:{device_id}"
    free = BASE_FREE + device_id * 8 * MIB
    bpb = kv_bytes_per_block(gcu_tiny_model_dir)
    assert r["num_kv_blocks"] == math.floor(frac * free / bpb), r
    # not the plug-in's figure: 256 MiB minus the weights would give many more blocks
    assert r["num_kv_blocks"] < math.floor(frac * (256 * MIB - r["reserved_before_kv"]) / bpb) / 4
    line = _kv_line(run.stderr)
    assert re.search(rf"kv_cache_memory_fraction 0.5 of {free // MIB} MiB available on gcu:{device_id} after loading "
                     rf"the weights, from the TOPS runtime \(topsMemGetInfo in \S*libtopsrt.so: {free // MIB} MiB free "
                     rf"of {TOTAL // MIB} MiB\)", line), line


def test_engine_without_the_library_falls_back_to_the_plugin_figure(child, standin_plugin_dir, standin_package,
                                                                    gcu_tiny_model_dir, tmp_path):
    total_mb, frac = 256, 0.5
    env = {"STANDIN_GCU_TOTAL_MEMORY_MB": total_mb, tops_runtime.LIBRARY_ENV: str(tmp_path / "no" / "libtopsrt.so")}
    run = child({"action": "start", "engine": engine_kwargs(gcu_tiny_model_dir, num_kv_blocks=0,
                                                            kv_cache_memory_fraction=frac)},
                standin_plugin_dir, standin_package, env=env)
    r = run.ok()
    bpb = kv_bytes_per_block(gcu_tiny_model_dir)
    assert r["num_kv_blocks"] == math.floor(frac * (total_mb * MIB - r["reserved_before_kv"]) / bpb), r
    line = _kv_line(run.stderr)
    assert ("from the plug-in's total memory minus Paddle's reserved (no TOPS runtime figure: the TOPS runtime did "
            "not load (") in line and "no/libtopsrt.so" in line, line
