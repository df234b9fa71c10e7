"""Run a kernel that can kill the process (SIGILL, abort) once in a child process before the engine
relies on it, and remember the verdict on disk so that later starts on the same host skip the child.

The verdict is keyed by the check's name, the Paddle version and the CPU (model and flags): a new
Paddle or another CPU checks again. Cache folder: $PADDLE_LLM_CACHE_DIR, else
$XDG_CACHE_HOME/paddle_llm, else ~/.cache/paddle_llm. A cache that cannot be written only costs the
child run at each start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Importing paddle alone takes a few seconds; a busy shared host can take many times that.
CHILD_TIMEOUT_S = 300.0

# The child computes fused and composed RMSNorm on the same input and prints the largest difference.
_RMS_NORM_CHECK = r"""
import numpy as np, paddle
from paddle.incubate.nn.functional import fused_rms_norm
paddle.set_device("cpu")
rng = np.random.default_rng(0)
x = paddle.to_tensor(rng.standard_normal((7, 576)).astype("float32"))
w = paddle.to_tensor(rng.standard_normal(576).astype("float32"))
fused = fused_rms_norm(x, w, None, 1e-5, 1)[0].numpy()
ref = (x * paddle.rsqrt((x * x).mean(axis=-1, keepdim=True) + 1e-5) * w).numpy()
print(float(np.abs(fused - ref).max()))
"""

CHECKS = {"fused_rms_norm_cpu": (_RMS_NORM_CHECK, 1e-4)}


@dataclass(frozen=True)
class ChildVerdict:
    """ok: the kernel ran and matched the composed ops within tolerance; detail: why not, or the
    measured difference; cached: read from the cache instead of running a child now."""

    ok: bool
    detail: str
    cached: bool = False


def _cache_file() -> Path:
    base = os.environ.get("PADDLE_LLM_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "paddle_llm")
    return Path(base) / "kernel_checks.json"


def _key(name: str, paddle_version: str, cpu_model: str, cpu_flags) -> str:
    flags = hashlib.sha256(" ".join(sorted(cpu_flags)).encode()).hexdigest()[:16]
    return f"{name}|paddle {paddle_version}|{cpu_model}|flags {flags}"


def _run_child(code: str, tolerance: float) -> ChildVerdict:
    env = dict(os.environ)
    env.pop("CUSTOM_DEVICE_ROOT", None)  # the check is about the CPU kernel only
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return ChildVerdict(False, f"the check did not finish within {CHILD_TIMEOUT_S:.0f} s")
    if proc.returncode != 0:
        if proc.returncode < 0:
            try:
                what = signal.Signals(-proc.returncode).name
            except ValueError:
                what = f"signal {-proc.returncode}"
            return ChildVerdict(False, f"the check process died with {what}")
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return ChildVerdict(False, f"the check failed (exit {proc.returncode}: {tail[:200]})")
    try:
        diff = float(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ChildVerdict(False, f"the check printed no result: {proc.stdout[-200:]!r}")
    if not diff <= tolerance:
        return ChildVerdict(False, f"the kernel differs from the composed ops by {diff:.3g} (> {tolerance:g})")
    return ChildVerdict(True, f"max difference to the composed ops {diff:.2g}")


def verify_in_child(name: str, paddle_version: str, cpu_model: str, cpu_flags) -> ChildVerdict:
    """The verdict of check `name` (a key of CHECKS) on this host: from the cache when this Paddle
    and CPU were checked before, else from a child process (then cached). Never raises for a
    failing kernel: the verdict says why."""
    code, tolerance = CHECKS[name]
    key = _key(name, paddle_version, cpu_model, cpu_flags)
    path = _cache_file()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        entry = cache[key]
        return ChildVerdict(bool(entry["ok"]), str(entry["detail"]), cached=True)
    verdict = _run_child(code, tolerance)
    cache[key] = {"ok": verdict.ok, "detail": verdict.detail}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as e:
        log.warning("cannot write the kernel-check cache %s (%s): the check runs again at the next start", path, e)
    return verdict
