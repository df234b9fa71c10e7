"""Edit a copy of model_repository/ for tests that start their own server (triton_server_factory)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

# the launcher's own config.pbtxt edits (`make serve`'s LLM_PARAMS overlay uses them too)
from paddle_llm_launcher.overrides import set_config_parameter, set_instance_count  # noqa: F401

MODEL_REPO = Path(__file__).resolve().parents[2] / "model_repository"


def copy_repository(dst: Path, models=None, edit=None) -> Path:
    """Copy model_repository/ to `dst` (no __pycache__), keep only `models` (all when None), then
    call edit(dst) on the copy; returns dst. The shipped configs are never touched."""
    shutil.copytree(MODEL_REPO, dst, ignore=shutil.ignore_patterns("__pycache__"))
    if models is not None:
        for d in dst.iterdir():
            if d.is_dir() and d.name not in models:
                shutil.rmtree(d)
    if edit is not None:
        edit(dst)
    return dst

