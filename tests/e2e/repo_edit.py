"""Edit a copy of model_repository/ for tests that start their own server (triton_server_factory)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

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


def set_config_parameter(config_path: Path, key: str, value: str) -> None:
    """Set (or add) `parameters { key: KEY value: { string_value: VALUE } }` in a config.pbtxt copy."""
    text = config_path.read_text()
    pat = re.compile(r'parameters\s*\{\s*key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*"[^"]*"\s*\}\s*\}')
    line = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
    text = pat.sub(line, text) if pat.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    config_path.write_text(text)


def set_instance_count(config_path: Path, count: int) -> None:
    """Replace the instance_group of a config.pbtxt copy by `count` KIND_CPU instances."""
    text = config_path.read_text()
    new, n = re.subn(r"instance_group\s*\[[^\]]*\]", f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]", text)
    assert n == 1, f"no instance_group in {config_path}"
    config_path.write_text(new)
