"""Fixtures of the stand-in GCU tests (tests/gcu/): the engine's GCU code path on a fake `gcu`
device backed by host memory (tests/gcu_standin/standin_gcu.cc). Not an Enflame GCU: no GCU kernels,
no bf16/fp16 numerics, no speed, no real memory behaviour.

Session fixtures build the plug-in (cached by source hash under build/gcu_standin/), write the
stand-in `paddle-custom-gcu` package, and make the tiny random Llama of the unit tests.

Everything that loads the plug-in runs in a child process (`run_child`), with a hard timeout:
loading it into the pytest process would make gcu:0 Paddle's default device for every later test.
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
HERE = Path(__file__).resolve().parent
for _p in (REPO / "tests" / "unit", REPO / "tests" / "e2e", HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
if importlib.util.find_spec("paddle_llm_engine") is None:  # not pip-installed: use the source tree
    sys.path[:0] = [str(REPO / "backend"), str(REPO / "ops")]

from gcu_child import MARK  # noqa: E402


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

CHILD = HERE / "gcu_child.py"
CHILD_TIMEOUT_S = 300.0  # generous: the machine is shared and slow
SMOLLM2_DIR = Path(os.environ.get("PADDLE_LLM_MODEL_DIR", REPO / "build" / "SmolLM2-135M-Instruct"))
# Variables of the caller that would change what a child sees.
_SCRUB = ("CUSTOM_DEVICE_ROOT", "PYTHONPATH", "FLAGS_use_stride_kernel", "FLAGS_selected_gcus",
          "STANDIN_GCU_TOTAL_MEMORY_MB", "STANDIN_GCU_DEVICE_COUNT")


@pytest.fixture(scope="session")
def standin_plugin_dir() -> Path:
    """Folder holding only the stand-in plug-in's .so (CUSTOM_DEVICE_ROOT)."""
    try:
        return standin_build.build_plugin()
    except standin_build.PluginBuildError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def standin_package_factory(tmp_path_factory):
    """version -> folder holding a stand-in paddle-custom-gcu of that version (made once per version)."""
    made: dict[str, Path] = {}

    def make(version: str | None = None) -> Path:
        key = version or ""
        if key not in made:
            made[key] = standin_build.write_standin_package(tmp_path_factory.mktemp("standin_pkg"), version)
        return made[key]

    return make


@pytest.fixture(scope="session")
def standin_package(standin_package_factory) -> Path:
    """The stand-in package whose version matches the installed paddlepaddle (3.3.1 -> 3.3.1+standin)."""
    return standin_package_factory(None)


@pytest.fixture(scope="session")
def gcu_tiny_model_dir(tmp_path_factory) -> str:
    from tiny_model import make_tiny_llama

    if not (SMOLLM2_DIR / "tokenizer.json").is_file():
        pytest.fail(f"{SMOLLM2_DIR} has no tokenizer.json: run scripts/setup.sh", pytrace=False)
    return str(make_tiny_llama(tmp_path_factory.mktemp("gcu_tiny_llama"), SMOLLM2_DIR))


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


@pytest.fixture
def child():
    return run_child
