"""EngineConfig from the `parameters` of a Triton model's config.pbtxt.

Every engine setting is a config parameter with a documented default (EngineConfig's). The one
environment fallback: `model_dir` empty in config.pbtxt -> PADDLE_LLM_MODEL_DIR, which the launcher
sets from MODEL_DIR; a non-empty config value always wins. Unknown parameter names are an error.
"""

from __future__ import annotations

import dataclasses
import os

from paddle_llm_engine.config import EngineConfig

_INT_FIELDS = {f.name for f in dataclasses.fields(EngineConfig) if f.type in ("int", int)}
_STR_FIELDS = {"model_dir", "device"}
_OTHER_KEYS = {"gcu_device_ids"}


def engine_config_from_triton(model_config: dict, args: dict) -> EngineConfig:
    """model_config: parsed config.pbtxt JSON; args: initialize() args (instance kind / device id).

    Raises ValueError naming an unknown or malformed parameter."""
    raw = {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}
    unknown = set(raw) - _INT_FIELDS - _STR_FIELDS - _OTHER_KEYS
    if unknown:
        raise ValueError(f"unknown parameters in config.pbtxt: {sorted(unknown)}")
    kwargs = {}
    for k, v in raw.items():
        if k in _OTHER_KEYS or v == "":
            continue
        if k in _INT_FIELDS:
            try:
                kwargs[k] = int(v)
            except ValueError:
                raise ValueError(f"config.pbtxt parameter {k} must be an integer, got {v!r}") from None
        else:
            kwargs[k] = v
    if not kwargs.get("model_dir"):
        env = os.environ.get("PADDLE_LLM_MODEL_DIR", "")
        if not env:
            raise ValueError("parameter model_dir is empty and PADDLE_LLM_MODEL_DIR is not set")
        kwargs["model_dir"] = env
    # Instance -> device: the Triton instance's device id, remapped by gcu_device_ids "0;1;2;3".
    device_id = int(args.get("model_instance_device_id", 0) or 0)
    ids = [x for x in raw.get("gcu_device_ids", "").split(";") if x.strip()]
    if ids:
        device_id = int(ids[device_id % len(ids)])
    kwargs["device_id"] = device_id
    return EngineConfig(**kwargs)


def resolve_model_dir(model_config: dict) -> str:
    """The `model_dir` parameter of a config.pbtxt, or PADDLE_LLM_MODEL_DIR when it is empty.

    Raises ValueError when neither is set."""
    v = model_config.get("parameters", {}).get("model_dir", {}).get("string_value", "")
    v = v or os.environ.get("PADDLE_LLM_MODEL_DIR", "")
    if not v:
        raise ValueError("parameter model_dir is empty and PADDLE_LLM_MODEL_DIR is not set")
    return v
