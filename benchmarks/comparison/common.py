"""What every part of benchmarks/compare.py shares: paths, the systems' names and labels, the warm-up
request, lazy access to sibling modules (benchmarks/, client_examples/, tests/support/), the environment
of child processes and the progress log on stderr."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = BENCH_DIR.parent
CLIENT_DIR = REPO_ROOT / "client_examples"
COMPARE_SCRIPT = BENCH_DIR / "compare.py"
PEER_VENV = REPO_ROOT / "build" / "peer-venv"
PEER_PINS = ["xllamacpp==2026.10.11549"]
PLOT_PINS = ["matplotlib==3.11.2"]  # only when .venv has no matplotlib
WARMUP_QUESTION = "Say hello in one word."
WARMUP_TOKENS = 4

SYSTEMS = ("offline", "llm", "ensemble", "openai", "hf", "llamacpp-f32", "llamacpp-q8_0", "llamacpp-q4_1")
OURS = ("offline", "llm", "ensemble", "openai")
TRITON = ("llm", "ensemble", "openai")  # run on one tritonserver (openai: the frontend beside it)
LABELS = {"offline": "ours offline", "llm": "ours Triton llm", "ensemble": "ours Triton ensemble",
          "openai": "ours OpenAI", "hf": "HF transformers", "llamacpp-f32": "llama.cpp F32",
          "llamacpp-q8_0": "llama.cpp Q8_0", "llamacpp-q4_1": "llama.cpp Q4_1"}


# --------------------------------------------------------------------------- sibling modules
# Imported on first use, not at import time: some need numpy, tritonclient or paddle, which the peer
# venv (where the plot worker may run) does not have.


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def bench_engine():
    return importlib.import_module("bench_engine")  # benchmarks/ is on sys.path: this package's parent


def bench_engine_report():
    return importlib.import_module("bench_engine_report")


def gguf_export():
    return importlib.import_module("gguf_export")


def _client_module(name: str):
    # the client examples import each other by name, so their folder goes on the path (last: no shadowing)
    if str(CLIENT_DIR) not in sys.path:
        sys.path.append(str(CLIENT_DIR))
    return importlib.import_module(name)


def load_stats():
    return _client_module("load_stats")


def load_client():
    return _client_module("load_client")


def repo_edit():
    return _load("repo_edit", REPO_ROOT / "tests" / "support" / "repo_edit.py")


def launcher():
    import paddle_llm_launcher as mod

    return mod


# --------------------------------------------------------------------------- child processes, log


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)
    return env


def log(msg: str) -> None:
    print(f"compare: {msg}", file=sys.stderr, flush=True)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""
