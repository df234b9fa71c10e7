"""Find fused kernels of the GCU plug-in (`paddle-custom-gcu`) when it is installed.

The plug-in registers custom ops under `paddle_custom_device.gcu.ops`; which ones exist depends on
its version, so every lookup falls back to the Paddle implementation in this package.
"""

from __future__ import annotations

import functools
import importlib


@functools.lru_cache(maxsize=None)
def _gcu_ops_module():
    try:
        return importlib.import_module("paddle_custom_device.gcu.ops")
    except Exception:  # plug-in absent (every CPU host): use the Paddle ops
        return None


def fused_op(name: str):
    """Return the plug-in's op `name`, or None when the plug-in or that op is absent."""
    mod = _gcu_ops_module()
    return getattr(mod, name, None) if mod is not None else None
