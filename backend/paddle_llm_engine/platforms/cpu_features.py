"""What the host CPU supports, read once from the kernel's view of it (Linux /proc/cpuinfo flags).

Decisions about CPU kernels are made from these flags, never by running an instruction to see
whether it faults: an illegal instruction kills the process (SIGILL) and cannot be caught.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuInfo:
    """model: the CPU's marketing name ("" when unknown); flags: lower-case feature flags as
    /proc/cpuinfo spells them ("avx2", "fma", "avx512f", ...); machine: platform.machine()."""

    model: str
    flags: frozenset
    machine: str

    def has(self, *flags: str) -> bool:
        """True when every named flag is present."""
        return all(f in self.flags for f in flags)

    def missing(self, *flags: str) -> list[str]:
        """The named flags this CPU lacks, in the order given."""
        return [f for f in flags if f not in self.flags]


def parse_cpuinfo(text: str, machine: str = "") -> CpuInfo:
    """CpuInfo from the text of /proc/cpuinfo (the first processor's "flags" and "model name";
    ARM kernels call the flags "Features")."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.lower().split())
        if model and flags:
            break
    return CpuInfo(model=model, flags=flags, machine=machine)


@functools.lru_cache(maxsize=1)
def host_cpu() -> CpuInfo:
    """This host's CpuInfo (cached). Without a readable /proc/cpuinfo the flag set is empty, so
    every optional CPU kernel is off: the safe side."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    return parse_cpuinfo(text, platform.machine())
