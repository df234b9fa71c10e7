"""What this process's cgroup and CPU affinity allow it to use: how many CPUs, and how many bytes
of memory before the cgroup's limit.

In a container, os.cpu_count() and /proc/meminfo describe the node, not the container. Kernel
threads sized from the node's cores under a Kubernetes CPU limit (a CFS quota) exhaust the quota
early in every period and are throttled for the rest of it; a KV cache sized from the node's
MemAvailable under a memory limit gets the container OOM-killed. So:

- usable_cpus(): min(CPUs in this process's affinity mask (which a cpuset narrows), the cgroup
  CPU quota rounded up), with a source text for the log;
- memory_headroom(): bytes left under the cgroup memory limit, or None when there is no limit.

The process's cgroup comes from /proc/self/cgroup and the hierarchies' mount points from
/proc/self/mountinfo, on cgroup v2 (unified), v1, and the hybrid layout (v1 controllers next to
an empty v2 hierarchy): a controller listed on a v1 line is read from its v1 hierarchy, else from
v2. Limits are read from the process's own cgroup directory and every ancestor up to the mount
point (a parent's limit binds the children too), and the tightest wins. With a private cgroup
namespace (a container's default on v2) the process's cgroup is "/", i.e. the mount point itself.

Every function takes `root`, the directory standing for "/" (default "/"), so tests can give a
fake tree. An unreadable or malformed file means "no limit known" at that level: never an
exception, never a guessed number; what was skipped is logged at debug.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# cgroup v1 reports "no memory limit" as the page counter's maximum in bytes (9223372036854771712
# with 4 KiB pages, other values just under 2^63 with other page sizes): no real limit is this large.
V1_UNLIMITED_BYTES = 2**60

# The CFS period when cpu.max gives only a quota (the kernel's default, in microseconds).
_DEFAULT_PERIOD_US = 100_000


@dataclass(frozen=True)
class _Mount:
    """One line of /proc/self/mountinfo: `root` (the mounted directory inside the hierarchy),
    `point` (where it is mounted), `fstype` ("cgroup" | "cgroup2" | ...), `options` (the super
    options: a v1 hierarchy's controllers)."""

    root: str
    point: str
    fstype: str
    options: frozenset[str]


def _under(root: str | os.PathLike | None, absolute: str) -> Path:
    """`absolute` (a path as this process sees it) inside the fake filesystem root."""
    return Path(root or "/") / absolute.lstrip("/")


def _read(path: Path) -> str | None:
    """The file's text, stripped; None (logged at debug) when it is absent or unreadable."""
    try:
        return path.read_text().strip()
    except OSError as e:  # absent (no such controller or level), permission, not a file
        log.debug("cgroup: skipped %s (%s)", path, e.strerror or type(e).__name__)
        return None


def _int(path: Path, text: str | None) -> int | None:
    """`text` as a non-negative int; None (logged at debug) when it is absent or not one."""
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()):  # what the kernel writes; int() would take "+1_0"
        log.debug("cgroup: skipped %s: not a byte or microsecond count: %r", path, text[:80])
        return None
    return int(text)


def _unescape(field: str) -> str:
    """A mountinfo path field: the kernel writes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(root) -> list[_Mount]:
    """The mounts of /proc/self/mountinfo (fields: id parent dev root point options [tags] - fstype
    source super-options); malformed lines are skipped, an unreadable file gives []."""
    path = _under(root, "/proc/self/mountinfo")
    out = []
    for line in (_read(path) or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 3:
            log.debug("cgroup: skipped a malformed line of %s: %r", path, line[:120])
            continue
        out.append(_Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], frozenset(tail[2].split(","))))
    return out


def _own_cgroup(controller: str, root) -> tuple[str, list[str], str] | None:
    """("v1" | "v2", the v1 line's controllers ([] on v2), this process's cgroup path) for
    `controller` from /proc/self/cgroup ("id:controllers:path" lines; v2's is "0::path"): the v1
    line listing the controller, else the v2 line; None when neither is there."""
    v2 = None
    for line in (_read(_under(root, "/proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            log.debug("cgroup: skipped a malformed line of /proc/self/cgroup: %r", line[:120])
            continue
        hier, controllers, path = parts
        if controller in controllers.split(","):
            return "v1", controllers.split(","), path
        if hier == "0" and not controllers:
            v2 = ("v2", [], path)
    return v2


def _relative(path: str, mount_root: str) -> str | None:
    """The cgroup `path` relative to a mount of the hierarchy's `mount_root`, or None when the
    mount does not show it (a path outside this cgroup namespace, or under another mount root)."""
    if ".." in path.split("/"):
        return None
    if mount_root == "/":
        return path
    if path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
        return path[len(mount_root.rstrip("/")):]
    return None


def cgroup_dirs(controller: str, root=None) -> tuple[str, list[Path]]:
    """("v1" | "v2", the directories holding `controller`'s ("cpu" | "memory") files for this
    process, its own cgroup first, then each ancestor up to the hierarchy's mount point), or
    ("", []) when the process is in no cgroup hierarchy that can be read.

    The mount point comes from /proc/self/mountinfo, else the usual places (/sys/fs/cgroup on v2,
    /sys/fs/cgroup/<controllers> or /sys/fs/cgroup/<controller> on v1). When the process's own
    directory is not visible there, only the mount point is read (what a container with a
    private cgroup namespace sees: its own cgroup)."""
    own = _own_cgroup(controller, root)
    if own is None:
        log.debug("cgroup: no %s hierarchy in /proc/self/cgroup", controller)
        return "", []
    version, controllers, path = own
    if version == "v1":
        fstype, wanted = "cgroup", controller
        usual = [f"/sys/fs/cgroup/{','.join(controllers)}", f"/sys/fs/cgroup/{controller}"]
    else:
        fstype, wanted, usual = "cgroup2", None, ["/sys/fs/cgroup"]
    mounts = [m for m in _mounts(root) if m.fstype == fstype and (wanted is None or wanted in m.options)]
    # a hierarchy can be mounted more than once: prefer a mount that shows this process's cgroup
    mount = next((m for m in mounts if _relative(path, m.root) is not None), mounts[0] if mounts else None)
    if mount is not None:
        mount_root, top = mount.root, _under(root, mount.point)
    else:
        found = [_under(root, u) for u in usual if _under(root, u).is_dir()]
        mount_root, top = "/", found[0] if found else _under(root, usual[0])
    rel = _relative(path, mount_root)
    own_dir = top / rel.strip("/") if rel is not None else top
    if not own_dir.is_dir():
        log.debug("cgroup: %s is not visible, reading %s only", own_dir, top)
        own_dir = top
    dirs = [own_dir]
    while dirs[-1] != top and top in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return version, dirs


# -- CPUs -----------------------------------------------------------------------------------------
def _quota_at(version: str, d: Path) -> tuple[int, int, str] | None:
    """(quota, period in microseconds, the file(s) they came from) of the CPU quota set on cgroup
    directory `d`, or None for no quota there (also an absent or malformed file)."""
    if version == "v2":
        path = d / "cpu.max"
        text = _read(path)
        fields = text.split() if text is not None else None
        if not fields or len(fields) > 2 or fields[0] == "max":  # absent, malformed, or no quota
            if fields is not None and (not fields or len(fields) > 2):
                log.debug("cgroup: skipped %s: not 'max|<quota> [<period>]': %r", path, text[:80])
            return None
        quota = _int(path, fields[0])
        period = _int(path, fields[1]) if len(fields) == 2 else _DEFAULT_PERIOD_US
        label = "cpu.max"
    else:
        text = _read(d / "cpu.cfs_quota_us")
        if text is None or text == "-1":  # -1: no quota
            return None
        quota = _int(d / "cpu.cfs_quota_us", text)
        period = _int(d / "cpu.cfs_period_us", _read(d / "cpu.cfs_period_us"))
        label = "cpu.cfs_quota_us/cpu.cfs_period_us"
    if quota == 0 or period == 0:  # the kernel refuses both: a file saying so is not a limit to trust
        log.debug("cgroup: skipped the CPU quota in %s: quota %s, period %s", d, quota, period)
    if not quota or not period:
        return None
    return quota, period, label


def cpu_quota(root=None) -> tuple[int, int, str] | None:
    """(quota, period, the file(s) they came from) of the tightest CPU quota on this process's
    cgroup and its ancestors (quota / period = the CPUs' worth of time allowed per period), or
    None when there is none."""
    version, dirs = cgroup_dirs("cpu", root)
    best = None
    for d in dirs:
        q = _quota_at(version, d)
        if q is not None and (best is None or q[0] * best[1] < best[0] * q[1]):
            best = q
    return best


def _affinity_cpus() -> int | None:
    """CPUs in this process's affinity mask (a cpuset or taskset narrows it), or None where the
    platform has no sched_getaffinity."""
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):
        return None


def usable_cpus(root=None, *, affinity: int | None = None, cpu_count: int | None = None) -> tuple[int, str]:
    """(CPUs this process can keep busy, where that count comes from), the count >= 1:
    min(CPUs of its affinity mask, else os.cpu_count(); ceil(quota / period) of the tightest cgroup
    CPU quota), e.g. (2, "2 of 8 CPUs: cgroup cpu.max quota 150000/100000 = 1.50 CPUs, rounded up").

    A fractional quota is rounded up: the last thread then runs part of each period, where
    rounding down would leave allowed CPU time unused. `affinity` / `cpu_count` stand for the
    process's mask size and os.cpu_count() (tests)."""
    total = cpu_count or os.cpu_count() or 1
    mask = affinity or _affinity_cpus()
    # (count, text) of each bound, the quota first so that it is the one named when both agree
    bounds = []
    quota = cpu_quota(root)
    if quota is not None:
        q, period, label = quota
        bounds.append((max(1, math.ceil(q / period)), f"cgroup {label} quota {q}/{period} = {q / period:.2f} CPUs"
                       + (", rounded up" if q % period else "")))
    bounds.append((mask, f"CPU affinity allows {mask}") if mask else (total, "os.cpu_count(), no affinity mask"))
    count, why = min(bounds, key=lambda b: b[0])
    others = [text for _, text in bounds if text != why]
    if quota is None:
        others.append("no cgroup CPU quota")
    count = max(1, count)
    return count, f"{count} of {total} CPUs: {why}" + (f" ({'; '.join(others)})" if others else "")


# -- memory ---------------------------------------------------------------------------------------
_MEMORY_FILES = {
    # version -> (limit file, usage file, memory.stat keys of reclaimable inactive file cache, best first)
    "v2": ("memory.max", "memory.current", ("inactive_file",)),
    "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes", ("total_inactive_file", "inactive_file")),
}


def _inactive_file(path: Path, keys: tuple[str, ...]) -> int:
    """Bytes of inactive file cache charged to the cgroup (memory.stat), 0 when unknown."""
    stat = {}
    for line in (_read(path) or "").splitlines():
        k, _, v = line.partition(" ")
        stat[k] = v
    for k in keys:
        if k in stat:
            value = _int(path, stat[k])
            return value or 0
    log.debug("cgroup: no %s in %s: counting all charged memory as used", "/".join(keys), path)
    return 0


def _headroom_at(version: str, d: Path) -> tuple[int, str] | None:
    """(bytes left under the memory limit of cgroup directory `d`, how that was computed), or None
    for no limit there (also an absent or malformed limit or usage file)."""
    limit_file, usage_file, inactive_keys = _MEMORY_FILES[version]
    text = _read(d / limit_file)
    if text is None or text == "max":
        return None
    limit = _int(d / limit_file, text)
    if limit is None or limit >= V1_UNLIMITED_BYTES:
        return None
    usage = _int(d / usage_file, _read(d / usage_file))
    if usage is None:  # a limit without its usage gives no headroom figure: no limit known here
        log.debug("cgroup: %s has %s %d but no readable %s: limit ignored", d, limit_file, limit, usage_file)
        return None
    # Inactive file cache (the weights just read, for one) is reclaimed before the OOM killer runs,
    # as MemAvailable counts reclaimable caches; the same working set the kubelet evicts on.
    inactive = min(usage, _inactive_file(d / "memory.stat", inactive_keys))
    used = usage - inactive
    return max(0, limit - used), (f"cgroup {limit_file} {limit / 2**20:.0f} MiB minus {used / 2**20:.0f} MiB in "
                                  f"use ({usage_file} less {inactive / 2**20:.0f} MiB of inactive file cache)")


def memory_headroom(root=None) -> tuple[int | None, str]:
    """(bytes this process's cgroup may still allocate before its memory limit, how that was
    computed), the tightest over its cgroup and its ancestors: limit - (usage - inactive file
    cache); (None, why) when no limit is known (none set: v2 "max", v1 >= 2^60; or unreadable)."""
    version, dirs = cgroup_dirs("memory", root)
    if not version:
        return None, "no memory cgroup found"
    best = None
    for d in dirs:
        h = _headroom_at(version, d)
        if h is not None and (best is None or h[0] < best[0]):
            best = h
    if best is None:
        return None, f"no cgroup {version} memory limit"
    return best
