"""Which device this process runs on (a Device, parsed once from the operator's setting), the
supported Paddle / GCU plug-in versions, and how much memory a device has left for the KV cache.

A GCU host is one where the `paddle-custom-gcu` plug-in registered the custom device type "gcu".
"""

from __future__ import annotations

import importlib.metadata as md
import logging

from paddle_llm_engine.platforms import cgroup

log = logging.getLogger(__name__)

# paddle-custom-gcu releases are built against one Paddle release; a mismatch fails deep inside
# the plug-in's kernels, so start-up refuses it with one message naming both versions.
SUPPORTED_GCU_MATRIX = {
    # paddle version prefix -> accepted paddle-custom-gcu version prefixes
    "3.3": ("3.3",),
    "3.2": ("3.2",),
    "3.1": ("3.1",),
}


class PlatformError(RuntimeError):
    """The accelerator stack cannot be used as installed."""


DEVICE_KINDS = ("cpu", "gcu")
_DEVICE_SYNTAX = "device must be 'auto', 'cpu' or 'gcu[:id]'"


class Device(str):
    """A device, parsed once: `kind` ("cpu" | "gcu") and `index` (the device id; 0 for the CPU).

    It is also its canonical name ("cpu", "gcu:1"), a str, so it logs, compares, pickles and goes
    to paddle.set_device as that name. Device("gcu", 1) builds one, Device.parse("gcu:1") reads one
    (ValueError for anything else)."""

    kind: str
    index: int
    CPU: "Device"

    def __new__(cls, kind: str, index: int = 0):
        if kind not in DEVICE_KINDS:
            raise ValueError(f"{_DEVICE_SYNTAX}, got {kind!r}")
        if kind == "cpu":
            index = 0
        elif not (isinstance(index, int) and index >= 0):
            raise ValueError(f"a device id must be an integer >= 0, got {index!r}")
        obj = super().__new__(cls, "cpu" if kind == "cpu" else f"{kind}:{index}")
        obj.kind, obj.index = kind, index
        return obj

    def __getnewargs__(self):
        return self.kind, self.index

    @classmethod
    def parse(cls, text: str) -> "Device":
        """"cpu" or "<kind>:<id>" (a Device is returned as it is). Raises ValueError otherwise."""
        if isinstance(text, Device):
            return text
        kind, sep, idx = str(text).partition(":")
        if kind == "cpu" and not sep:
            return cls("cpu")
        if kind in DEVICE_KINDS and sep and idx.isdigit():
            return cls(kind, int(idx))
        raise ValueError(f"{_DEVICE_SYNTAX}, got {text!r}")


Device.CPU = Device("cpu")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _paddle_version() -> str | None:
    """The installed paddlepaddle's version (its distribution, else paddle.__version__ for source builds)."""
    v = _version("paddlepaddle")
    if v is None:
        try:
            import paddle

            v = paddle.__version__
        except ImportError:
            return None
    return v


def _major_minor(version: str) -> str:
    """"3.3.1" -> "3.3", "3.1.0.dev20250101" -> "3.1" (compared whole, so "3.30" is not "3.3")."""
    return ".".join(version.split("+")[0].split(".")[:2])


def _supported_text() -> str:
    return ", ".join(f"paddlepaddle {k}.x with paddle-custom-gcu {'/'.join(v)}.x"
                     for k, v in SUPPORTED_GCU_MATRIX.items())


def check_gcu_versions(paddle_version: str | None = None, plugin_version: str | None = None) -> None:
    """Raise one PlatformError naming the versions found and the versions supported when the
    installed paddlepaddle / paddle-custom-gcu pair is not in SUPPORTED_GCU_MATRIX, or when the
    plug-in is not installed. Arguments override the installed versions (tests)."""
    paddle_version = paddle_version or _paddle_version()
    plugin_version = plugin_version or _version("paddle-custom-gcu")
    if plugin_version is None:
        raise PlatformError(
            f"device gcu requested but the paddle-custom-gcu plug-in is not installed (found paddlepaddle "
            f"{paddle_version or 'not installed'}); install the plug-in matching paddlepaddle, "
            f"supported: {_supported_text()}; or set device to cpu")
    if paddle_version is None:
        raise PlatformError(f"paddle-custom-gcu {plugin_version} is installed but paddlepaddle is not; "
                            f"supported: {_supported_text()}")
    accepted = SUPPORTED_GCU_MATRIX.get(_major_minor(paddle_version), ())
    if _major_minor(plugin_version) not in accepted:
        raise PlatformError(
            f"unsupported accelerator stack: found paddlepaddle {paddle_version} and paddle-custom-gcu "
            f"{plugin_version}; supported: {_supported_text()}"
        )


def gcu_available() -> bool:
    """True when the plug-in registered the custom device type "gcu" with paddle."""
    import paddle

    try:
        return "gcu" in paddle.device.get_all_custom_device_type()
    except Exception:
        return False


def resolve_device(device: str, device_id: int) -> Device:
    """The operator's `device` setting as a Device: "auto" -> gcu:<device_id> on a GCU host (the
    plug-in installed or the device type registered), else the CPU; "gcu" -> gcu:<device_id>. A gcu
    place checks the versions and that the plug-in registered the device, and raises PlatformError
    otherwise; an unknown name is a ValueError. "auto" with paddle-custom-gcu installed but not
    loaded (a version mismatch, a driver fault) is that PlatformError, not a quiet fall back to the
    CPU: a GCU host serving on its CPU would look up and be 50x slower; set device cpu to mean it."""
    if device == "auto":
        device = "gcu" if _version("paddle-custom-gcu") is not None or gcu_available() else "cpu"
    if device == "gcu" or device.startswith("gcu:"):
        check_gcu_versions()
        if not gcu_available():
            raise PlatformError(
                f"paddle-custom-gcu {_version('paddle-custom-gcu')} is installed with paddlepaddle "
                f"{_paddle_version()} but paddle has no 'gcu' device type: the plug-in did not load "
                f"(check the Enflame driver and TopsRider runtime, and the paddle log for the plug-in's error)")
        return Device("gcu", device_id) if device == "gcu" else Device.parse(device)
    return Device.parse(device)


# -- memory available for the KV cache ------------------------------------------------------------
def _mem_available() -> int | None:
    """The host's MemAvailable in bytes (free memory plus reclaimable caches), through psutil when
    installed, else /proc/meminfo; None when neither is readable."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # not installed, or an unsupported platform
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the value is in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_memory_report(cgroup_root=None) -> tuple[int | None, str]:
    """(bytes of host memory this process may still allocate without swapping or being OOM-killed,
    where that figure comes from): the host's MemAvailable, or the headroom under this process's
    cgroup memory limit when that is smaller (a container's limit; cgroup.memory_headroom: limit
    minus usage less inactive file cache). (None, why) when neither is known. `cgroup_root`: a
    fake filesystem root for the cgroup files (tests)."""
    avail = _mem_available()
    headroom, how = cgroup.memory_headroom(cgroup_root)
    if headroom is not None and (avail is None or headroom < avail):
        return headroom, how + ("" if avail is None else f", below the host's MemAvailable {avail / 2**20:.0f} MiB")
    if avail is None:
        return None, "no MemAvailable in /proc/meminfo and " + how
    return avail, "the host's MemAvailable" + ("" if headroom is None else f" (below the {how})")


def host_available_memory() -> int | None:
    """Bytes of host memory this process may still allocate: the host's MemAvailable (free memory
    plus reclaimable caches), capped by the headroom under this process's cgroup memory limit (in
    a container, MemAvailable is the node's). None when neither is readable. Where the figure comes
    from is logged (info when the cgroup limit decided it); host_memory_report() returns it."""
    avail, where = host_memory_report()
    log.log(logging.INFO if where.startswith("cgroup") else logging.DEBUG,
            "host memory available: %s MiB, from %s", "unknown" if avail is None else f"{avail / 2**20:.0f}", where)
    return avail


def gcu_available_memory(device: Device | str) -> int | None:
    """Bytes of device memory not yet held by Paddle's allocator on `device` ("gcu:<id>"): the
    device's total memory as the plug-in reports it (`paddle.base.core.get_device_properties(type,
    id)`; `paddle.device.get_device_properties` refuses custom devices) minus
    `paddle.device.memory_reserved` (the weights and anything else allocated so far). Memory used by
    other processes on the same device is not seen. None, with the reason logged, when the plug-in
    or this Paddle does not expose these (the caller then falls back to a fixed budget)."""
    import paddle

    device = Device.parse(device)
    try:
        total = int(paddle.base.core.get_device_properties(device.kind, device.index).total_memory)
        reserved = int(paddle.device.memory_reserved(str(device)))
    except Exception as e:  # API absent in this Paddle, or not implemented by the plug-in
        log.warning("cannot read the memory of %s from paddle (%s: %s)", device, type(e).__name__, e)
        return None
    if total <= 0:
        log.warning("the plug-in reports %d bytes of total memory for %s", total, device)
        return None
    return max(0, total - reserved)


def gcu_plugin_description() -> str:
    """One line naming the plug-in behind the "gcu" device type, for the start-up log: its
    distribution version and, from module `paddle_custom_device.gcu`, its TopsRider version and
    commit. A test stand-in (module attribute STANDIN true) is named as such, so that a log can never
    pass it off as an Enflame GCU."""
    version = _version("paddle-custom-gcu") or "unknown version"
    try:
        import paddle_custom_device.gcu as mod  # shipped by paddle-custom-gcu
    except Exception:
        mod = None
    if mod is not None and getattr(mod, "STANDIN", False):
        return (f"paddle-custom-gcu {version}: TEST STAND-IN plug-in backed by host memory, "
                f"not an Enflame GCU")
    tops = getattr(mod, "tops_version", None) if mod is not None else None
    commit = getattr(mod, "git_commit_id", None) if mod is not None else None
    extra = ", ".join(x for x in (tops and f"TopsRider {tops}", commit and f"commit {commit}") if x)
    return f"paddle-custom-gcu {version}" + (f" ({extra})" if extra else "")
