"""Settings without editing tracked files: `make serve` overrides of the `llm` model's parameters.

`LLM_PARAMS="quantization=wint8 speculative_method=ngram" make serve` (or launch_triton.py's
`--set KEY=VALUE`, repeatable) serves a copy of the model repository under build/ in which the `llm`
model's config.pbtxt has those parameters set; the shipped repository is never written. Every key
is a config.pbtxt parameter of `llm` (EngineConfig's fields and the serving options of
config_params.py), plus `instances=N` for the number of `llm` instances (its instance_group count).
Unknown keys are refused before anything starts, naming the key; values are checked by `llm` when it
loads (a bad one fails the start with an error naming the parameter).

- parse_overrides(items) -> {key: value} from "key=value" strings (ValueError naming a bad item);
- check_keys(overrides): ValueError naming an unknown key (imports the engine's config: seconds);
- overlay_repository(src, dest, overrides) -> dest: the copy with the overrides applied;
- set_config_parameter / set_instance_count: the config.pbtxt edits (tests use them too).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

INSTANCES_KEY = "instances"
MODEL = "llm"


def parse_overrides(items) -> dict[str, str]:
    """["key=value", ...] (each item may hold several, space-separated) -> {key: value}, later
    items win. Raises ValueError naming an item without `=` or with an empty key."""
    out: dict[str, str] = {}
    for item in items:
        for part in str(item).split():
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"LLM_PARAMS / --set: expected key=value, got {part!r}")
            out[key.strip()] = value.strip()
    return out


def check_keys(overrides: dict[str, str]) -> None:
    """Raise ValueError naming every key `llm` does not accept (with the accepted names)."""
    from paddle_llm_engine.config import DEPRECATED_ALIASES
    from paddle_llm_triton.config_params import SERVING_KEYS, engine_fields

    known = set(engine_fields()) | SERVING_KEYS | set(DEPRECATED_ALIASES) | {INSTANCES_KEY}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"LLM_PARAMS / --set: unknown llm parameter(s) {', '.join(unknown)} "
                         f"(accepted: {', '.join(sorted(known))})")
    if INSTANCES_KEY in overrides:
        n = overrides[INSTANCES_KEY]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"LLM_PARAMS / --set: instances must be an integer >= 1, got {n!r}")


def set_config_parameter(config_path: Path, key: str, value: str) -> None:
    """Set (or add) `parameters { key: KEY value: { string_value: VALUE } }` in a config.pbtxt."""
    if '"' in value or "\\" in value or "\n" in value:
        raise ValueError(f"{key}: a parameter value may not contain quotes, backslashes or newlines")
    text = Path(config_path).read_text()
    # only a parameter the file sets: the shipped config lists the others on commented-out lines, and
    # a value written into such a comment would change nothing
    pat = re.compile(r'^[ \t]*parameters\s*\{\s*key:\s*"' + re.escape(key)
                     + r'"\s*value:\s*\{\s*string_value:\s*"[^"]*"\s*\}\s*\}', re.M)
    line = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
    text = pat.sub(lambda _m: line, text) if pat.search(text) else text.rstrip("\n") + "\n" + line + "\n"
    Path(config_path).write_text(text)


def set_instance_count(config_path: Path, count: int) -> None:
    """Replace the instance_group of a config.pbtxt by `count` KIND_CPU instances."""
    text = Path(config_path).read_text()
    new, n = re.subn(r"instance_group\s*\[[^\]]*\]", f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]", text)
    if n != 1:
        raise ValueError(f"no instance_group in {config_path}")
    Path(config_path).write_text(new)


def overlay_repository(src: Path, dest: Path, overrides: dict[str, str]) -> Path:
    """A fresh copy of the repository `src` at `dest` (replaced if present; no __pycache__) with
    `overrides` applied to the `llm` model's config.pbtxt. Returns dest."""
    src, dest = Path(src), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = dest / MODEL / "config.pbtxt"
    for key, value in overrides.items():
        if key == INSTANCES_KEY:
            set_instance_count(cfg, int(value))
        else:
            set_config_parameter(cfg, key, value)
    return dest
