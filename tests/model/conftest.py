"""Model-test fixtures: import path for the in-tree packages and the converted SmolLM2 folder."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("paddle_llm_engine") is None:  # not pip-installed: use the source tree
    sys.path[:0] = [str(REPO / "backend"), str(REPO / "ops")]


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """PADDLE_LLM_MODEL_DIR, default <repo>/build/SmolLM2-135M-Instruct. Setup always prepares it,
    so a missing folder is a failure, not a skip."""
    d = Path(os.environ.get("PADDLE_LLM_MODEL_DIR", REPO / "build" / "SmolLM2-135M-Instruct"))
    if not (d / "model.safetensors").is_file() or not (d / "config.json").is_file():
        pytest.fail(f"converted model not found in {d} (no model.safetensors / config.json): run the project "
                    f"setup (scripts/prepare_model.py) or set PADDLE_LLM_MODEL_DIR", pytrace=False)
    return str(d)
