"""The LoRA adapters an `llm` instance starts with, and its runtime-updating settings.

Start-time adapters come from two places, both loaded by the engine before the instance serves:
- the `lora_modules` parameter (EngineConfig; vLLM's --lora-modules);
- `multi_lora.json` beside the model, in the model version folder (`<repository>/llm/1/`), as
  Triton's vLLM backend reads it: a JSON object {lora_name: path}; a relative path is taken from
  that folder. Read only with enable_lora 1 (the vLLM backend's rule too; with enable_lora 0 the file
  is ignored with a warning).
The file's entries join lora_modules' (a name in both is an error unless both name the same
folder). A folder the engine cannot serve stops the start: the engine names the adapter and the
field (lora/adapter.py), and explain_start_error adds the file the adapter came from.

Runtime updating (allow_runtime_lora_updating, lora_root: ServingOptions) is checked here at
start: it needs enable_lora 1, an absolute lora_root that is a folder, and the admin key in the
server's environment (LORA_ADMIN_KEY_ENV); each missing piece fails the load naming it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from paddle_llm_engine import EngineConfig
from paddle_llm_triton.config_params import LORA_ADMIN_KEY_ENV, ServingOptions

log = logging.getLogger("llm")

MULTI_LORA_FILE = "multi_lora.json"
MIN_KEY_CHARS = 16


def multi_lora_path(args: dict) -> Path | None:
    """<model_repository>/<model_version>/multi_lora.json from Triton's initialize() args (None when
    the args do not say where the model lives)."""
    repo, version = args.get("model_repository"), args.get("model_version")
    if not repo or version in (None, ""):
        return None
    return Path(repo) / str(version) / MULTI_LORA_FILE


def read_multi_lora(path: Path) -> list[tuple[str, str]]:
    """[(name, path)] of a multi_lora.json (relative paths resolved against its folder). Raises
    ValueError naming the file for anything but a JSON object of non-empty strings."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: must be a JSON object {{\"lora_name\": \"path\", ...}}, got {type(obj).__name__}")
    out = []
    for name, p in obj.items():
        if not isinstance(p, str) or not name.strip() or not p.strip():
            raise ValueError(f"{path}: entry {name!r}: {p!r} must map a non-empty name to a non-empty path")
        out.append((name.strip(), os.path.normpath(os.path.join(path.parent, p.strip()))))
    return out


def add_start_adapters(cfg: EngineConfig, args: dict) -> dict[str, str]:
    """Fold multi_lora.json's adapters into cfg.lora_modules (as a JSON list, lora_modules' own
    entries first). Returns {name: multi_lora.json path} of the adapters that came from the file.
    Raises ValueError naming the file or the name given twice."""
    path = multi_lora_path(args)
    if path is None or not path.is_file():
        return {}
    if not cfg.enable_lora:
        log.warning("%s ignored: enable_lora is 0 (set enable_lora 1 to serve its adapters)", path)
        return {}
    from_file = read_multi_lora(path)
    entries = cfg.lora_module_entries()
    known = dict(entries)
    for name, folder in from_file:
        if name in known and Path(known[name]).resolve() != Path(folder).resolve():
            raise ValueError(f"LoRA adapter {name!r} is in both lora_modules ({known[name]}) and {path} ({folder}): "
                             f"give it once")
        if name not in known:
            entries.append((name, folder))
            known[name] = folder
    cfg.lora_modules = json.dumps([{"name": n, "path": p} for n, p in entries])
    log.info("LoRA adapters from %s: %s", path, ", ".join(n for n, _ in from_file) or "none")
    return {name: str(path) for name, _ in from_file}


def explain_start_error(e: Exception, from_file: dict[str, str]) -> Exception:
    """An engine start error about an adapter of multi_lora.json, with the file named (the engine's
    message names the adapter and the field); other errors unchanged."""
    text = str(e)
    for name, path in from_file.items():
        if f"LoRA adapter {name!r}" in text:
            return ValueError(f"{text} (adapter {name!r} of {path})")
    return e


@dataclass(frozen=True)
class RuntimeLoraSettings:
    """Runtime LoRA updating, checked: root (resolved, a folder) and the admin key callers must send."""

    root: str
    key: str

    def __repr__(self) -> str:  # the key stays out of logs
        return f"RuntimeLoraSettings(root={self.root!r})"


def runtime_settings(cfg: EngineConfig, opts: ServingOptions, env=None) -> RuntimeLoraSettings | None:
    """The checked settings, or None when allow_runtime_lora_updating is 0. Raises ValueError naming
    the parameter (or the variable) that is missing or wrong."""
    if not opts.allow_runtime_lora_updating:
        return None
    if not cfg.enable_lora:
        raise ValueError("config.pbtxt parameter allow_runtime_lora_updating needs enable_lora 1")
    root = opts.lora_root
    if not root:
        raise ValueError("config.pbtxt parameter allow_runtime_lora_updating needs lora_root: the folder runtime-"
                         "loaded adapters must lie under")
    if not os.path.isabs(root) or not os.path.isdir(root):
        raise ValueError(f"config.pbtxt parameter lora_root must be an absolute path of a folder, got {root!r}")
    key = (os.environ if env is None else env).get(LORA_ADMIN_KEY_ENV, "")
    if len(key) < MIN_KEY_CHARS:
        raise ValueError(f"allow_runtime_lora_updating 1 needs the environment variable {LORA_ADMIN_KEY_ENV} (at "
                         f"least {MIN_KEY_CHARS} characters) in tritonserver's environment: the secret a load or "
                         f"unload must carry (the launcher, make serve, sets one per start)")
    return RuntimeLoraSettings(os.path.realpath(root), key)
