"""Which device this process runs on, and the supported Paddle / GCU plug-in versions.

A GCU host is one where the `paddle-custom-gcu` plug-in registered the custom device type "gcu".
"""

from __future__ import annotations

import importlib.metadata as md
import logging

log = logging.getLogger(__name__)

# paddle-custom-gcu releases are built against one Paddle release; a mismatch fails deep inside
# the plug-in's kernels, so start-up refuses it with one message (case C8).
SUPPORTED_GCU_MATRIX = {
    # paddle version prefix -> accepted paddle-custom-gcu version prefixes
    "3.3": ("3.3",),
    "3.2": ("3.2",),
    "3.1": ("3.1",),
}


class PlatformError(RuntimeError):
    """The accelerator stack cannot be used as installed."""


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def check_gcu_versions(paddle_version: str | None = None, plugin_version: str | None = None) -> None:
    """Raise PlatformError naming the found and supported versions when they do not match."""
    paddle_version = paddle_version or _version("paddlepaddle")
    plugin_version = plugin_version or _version("paddle-custom-gcu")
    if plugin_version is None:
        raise PlatformError("device gcu requested but paddle-custom-gcu is not installed")
    if paddle_version is None:
        raise PlatformError("paddlepaddle is not installed")
    key = ".".join(paddle_version.split(".")[:2])
    accepted = SUPPORTED_GCU_MATRIX.get(key)
    if accepted is None or not any(plugin_version.startswith(a) for a in accepted):
        supported = ", ".join(f"paddlepaddle {k}.x with paddle-custom-gcu {'/'.join(v)}.x"
                              for k, v in SUPPORTED_GCU_MATRIX.items())
        raise PlatformError(
            f"unsupported accelerator stack: found paddlepaddle {paddle_version} and paddle-custom-gcu "
            f"{plugin_version}; supported: {supported}"
        )


def gcu_available() -> bool:
    import paddle

    try:
        return "gcu" in paddle.device.get_all_custom_device_type()
    except Exception:
        return False


def resolve_device(device: str, device_id: int) -> str:
    """"auto" -> "gcu:<device_id>" on a GCU host, else "cpu". Explicit "gcu..." checks versions."""
    if device == "auto":
        device = f"gcu:{device_id}" if gcu_available() else "cpu"
    if device.startswith("gcu"):
        check_gcu_versions()
        if ":" not in device:
            device = f"gcu:{device_id}"
    elif device != "cpu":
        raise ValueError(f"device must be 'auto', 'cpu' or 'gcu[:id]', got {device!r}")
    return device
