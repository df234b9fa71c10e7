"""Helpers of the stand-in GCU tests (tests/gcu/): run tests/gcu/gcu_child.py in a child process
with the stand-in plug-in and package, with a hard timeout, and load tests/gcu_standin/build.py.

Everything that loads the plug-in runs in a child: loading it into the pytest process would make
gcu:0 Paddle's default device for every later test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHILD = REPO / "tests" / "gcu" / "gcu_child.py"
MARK = "GCU_CHILD_RESULT "  # gcu_child.py's result-line prefix (the child is a script, not imported)
CHILD_TIMEOUT_S = 300.0  # generous: the machine is shared and slow
BLOCK = 16
MAX_LEN = 128
# Variables of the caller that would change what a child sees.
_SCRUB = ("CUSTOM_DEVICE_ROOT", "PYTHONPATH", "FLAGS_use_stride_kernel", "FLAGS_selected_gcus",
          "STANDIN_GCU_TOTAL_MEMORY_MB", "STANDIN_GCU_DEVICE_COUNT")


def _load_standin_build():
    """tests/gcu_standin/build.py under a name of its own (a bare `build` could be PyPA's package)."""
    name = "gcu_standin_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "gcu_standin" / "build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


standin_build = _load_standin_build()


@dataclass
class ChildRun:
    result: dict
    stderr: str
    returncode: int

    @property
    def error(self) -> dict | None:
        return self.result.get("error")

    def ok(self) -> dict:
        """The result, failing the test with the child's error and log tail when it raised."""
        if self.error:
            pytest.fail(f"child raised {self.error['type']}: {self.error['message']}\n--- child stderr (tail) ---\n"
                        f"{tail(self.stderr)}", pytrace=False)
        return self.result


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def child_env(plugin_dir: Path | None, package_dir: Path | None, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["OMP_NUM_THREADS"] = "1"
    env["GLOG_minloglevel"] = env.get("GLOG_minloglevel", "1")  # Paddle's INFO chatter off
    if plugin_dir is not None:
        env["CUSTOM_DEVICE_ROOT"] = str(plugin_dir)
    if package_dir is not None:
        env["PYTHONPATH"] = str(package_dir)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def run_child(spec: dict, plugin_dir: Path | None, package_dir: Path | None = None, env: dict | None = None,
              timeout: float = CHILD_TIMEOUT_S) -> ChildRun:
    """Run tests/gcu/gcu_child.py with `spec` in a fresh interpreter (own process group, killed on
    timeout). plugin_dir None: no plug-in; package_dir None: no stand-in package on the path."""
    proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)], env=child_env(plugin_dir, package_dir, env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=str(REPO))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"child {spec['action']} did not finish within {timeout:.0f} s\n--- stderr (tail) ---\n{tail(err)}",
                    pytrace=False)
    lines = [l for l in out.splitlines() if l.startswith(MARK)]
    if not lines:
        pytest.fail(f"child {spec['action']} exited with code {proc.returncode} without a result\n"
                    f"--- stdout (tail) ---\n{tail(out)}\n--- stderr (tail) ---\n{tail(err)}", pytrace=False)
    return ChildRun(json.loads(lines[-1][len(MARK):]), err, proc.returncode)


def engine_kwargs(model_dir: str, **kw) -> dict:
    """EngineConfig kwargs of these tests: the tiny model on gcu:0, a small KV cache, one thread, an
    fp32 KV cache on both places these tests compare."""
    cfg = dict(model_dir=model_dir, device="gcu", device_id=0, block_size=BLOCK, num_kv_blocks=64,
               max_model_len=MAX_LEN, max_num_seqs=8, max_num_batched_tokens=512, num_threads=1,
               kv_cache_dtype="float32")
    cfg.update(kw)
    return cfg
