"""Fixtures of the stand-in GCU tests (tests/gcu/): the engine's GCU code path on a fake `gcu`
device backed by host memory (tests/gcu_standin/standin_gcu.cc). Not an Enflame GCU: no GCU kernels,
no bf16/fp16 numerics, no speed, no real memory behaviour.

Session fixtures build the plug-in (cached by source hash under build/gcu_standin/), write the
stand-in `paddle-custom-gcu` package, and make the tiny random Llama of the unit tests. `child` is
tests/support/gcu_helpers.run_child: everything that loads the plug-in runs in a child process with a hard timeout
(loaded into the pytest process, gcu:0 would become Paddle's default device for every later test).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("paddle_llm_engine") is None:  # not pip-installed: use the source tree
    sys.path[:0] = [str(REPO / "backend"), str(REPO / "ops")]

from gcu_helpers import run_child, standin_build  # noqa: E402  (tests/support)

SMOLLM2_DIR = Path(os.environ.get("PADDLE_LLM_MODEL_DIR", REPO / "build" / "SmolLM2-135M-Instruct"))


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


@pytest.fixture
def child():
    return run_child
