"""EngineConfig's LoRA settings (enable_lora, lora_modules, max_loras, max_lora_rank,
max_cpu_loras) checked, and lora_modules parsed; imports nothing of the engine (config.py uses it)."""

from __future__ import annotations

import json


def parse_lora_modules(text: str) -> list[tuple[str, str]]:
    """[(name, path)] of a lora_modules value: "name=path" entries separated by commas or
    whitespace, or a JSON list of {"name", "path"} objects. Raises ValueError naming lora_modules
    for an entry without a name or path, or a name given twice."""
    text = text.strip()
    if not text:
        return []
    out: list[tuple[str, str]] = []
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"lora_modules: not valid JSON ({e})") from None
        for it in items if isinstance(items, list) else [None]:
            if not isinstance(it, dict) or not isinstance(it.get("name"), str) or not isinstance(it.get("path"), str):
                raise ValueError(f'lora_modules: each JSON entry must be {{"name": str, "path": str}}, got {it!r}')
            out.append((it["name"].strip(), it["path"].strip()))
    else:
        for entry in text.replace(",", " ").split():
            name, eq, path = entry.partition("=")
            if not eq:
                raise ValueError(f"lora_modules: entry {entry!r} is not name=path")
            out.append((name.strip(), path.strip()))
    for name, path in out:
        if not name or not path:
            raise ValueError(f"lora_modules: an entry needs a name and a path, got {name!r}={path!r}")
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"lora_modules: adapter name(s) given twice: {', '.join(dup)}")
    return out


def check_lora_settings(cfg) -> None:
    """Check an EngineConfig's LoRA settings (ValueError naming the field) and resolve
    max_cpu_loras 0 to max_loras."""
    if cfg.enable_lora not in (0, 1):
        raise ValueError(f"enable_lora must be 0 or 1, got {cfg.enable_lora}")
    if cfg.max_loras < 1:
        raise ValueError(f"max_loras must be >= 1, got {cfg.max_loras}")
    if not 1 <= cfg.max_lora_rank <= 1024:
        raise ValueError(f"max_lora_rank must be in 1..1024, got {cfg.max_lora_rank}")
    if cfg.max_cpu_loras < 0:
        raise ValueError(f"max_cpu_loras must be >= 0 (0 = max_loras), got {cfg.max_cpu_loras}")
    if cfg.max_cpu_loras == 0:
        cfg.max_cpu_loras = cfg.max_loras
    if parse_lora_modules(cfg.lora_modules) and not cfg.enable_lora:
        raise ValueError("lora_modules needs enable_lora 1")
