"""Run the numerical check of an optional kernel (paddle_llm_ops.kernel_checks) and judge it: the
platform plan turns a kernel on only when its check passed on this place.

Judging: the check returns (max |kernel - composed|, max |composed|) on small seeded inputs; the
kernel passes when diff <= TOLERANCES[dtype] * max(1, max |composed|) (a relative tolerance, absolute
below 1). A NaN, a check that raises, a child that dies or hangs: all are failures, with the reason.

Where: in this process, except for the checks registered as isolated (a kernel that can kill the
process: Paddle's CPU fused_rms_norm runs AVX-512 on any CPU), which run in a child interpreter
that imports the check's function by module and name (_child_main).

Cache: a CPU verdict is remembered on disk, keyed by the check's name, dtype and parameters, the
Paddle version, the CPU (model and flags), the build of the kernel's library (for the C++ CPU
kernels: their source hash) and the check's own source, so a normal start reads it instead of
running the check. A plug-in kernel's check runs at every start on the device (not cached: the
plug-in or its firmware may change under the same Paddle). Cache folder: $PADDLE_LLM_CACHE_DIR,
else $XDG_CACHE_HOME/paddle_llm, else ~/.cache/paddle_llm (file kernel_checks.json); a cache that
cannot be written only costs the check at each start. Timeouts are not cached (a busy host).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from paddle_llm_engine.platforms.interpreter import python_executable

log = logging.getLogger(__name__)

# Relative tolerance per compute dtype (of the kernel's output against the composed ops').
TOLERANCES = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 5e-3}
# Importing paddle alone takes a few seconds; a busy shared host can take many times that.
CHILD_TIMEOUT_S = 300.0
_MARK = "KERNEL_CHECK_RESULT "
_CHILD_CODE = "import sys; from paddle_llm_engine.platforms.kernel_checks import _child_main; _child_main(sys.argv[1:])"


@dataclass(frozen=True)
class ChildVerdict:
    """ok: the kernel ran and matched the composed ops within tolerance; detail: the measured
    difference, or why it failed; cached: read from the cache instead of running the check now."""

    ok: bool
    detail: str
    cached: bool = False


def judge(diff: float, ref: float, dtype: str, part: str = "") -> ChildVerdict:
    """The verdict on a measured (max |kernel - composed|, max |composed|) in `dtype`. Raises
    KeyError for a dtype without a tolerance."""
    tol = TOLERANCES[dtype]
    bound = tol * max(1.0, ref)
    where = f"{part}: " if part else ""
    if diff <= bound:  # False for NaN
        return ChildVerdict(True, f"{where}max |kernel - composed| {diff:.2g} <= {tol:g} x max(1, {ref:.3g}) ({dtype})")
    return ChildVerdict(False, f"{where}max |kernel - composed| {diff:.3g} > {tol:g} x max(1, {ref:.3g}) ({dtype})")


def _measured(result) -> tuple[float, float, str]:
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise TypeError(f"a kernel check returns (difference, reference max[, part]), got {result!r}")
    return float(result[0]), float(result[1]), str(result[2]) if len(result) == 3 else ""


def run_check(name: str, dtype: str, **params) -> ChildVerdict:
    """Run check `name` in this process on the current device and judge it. Never raises for a
    failing kernel: a check that raises is a failed verdict naming the error."""
    from paddle_llm_ops.kernel_checks import load_checks

    try:
        fn = load_checks()[name]
        diff, ref, part = _measured(fn(dtype, **params))
    except Exception as e:  # the kernel (or its check) failed: that is the verdict
        return ChildVerdict(False, f"the check raised {type(e).__name__}: {_first_line(e)}")
    return judge(diff, ref, dtype, part)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:300]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CUSTOM_DEVICE_ROOT", None)  # an isolated check is about a CPU kernel only
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                     else []))
    return env


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def run_in_child(name: str, dtype: str, timeout: float = CHILD_TIMEOUT_S, **params) -> ChildVerdict:
    """Run check `name` in a child interpreter (CPU place) and judge its result: a child that
    dies (SIGILL, abort), exits with an error or outlives `timeout` seconds is a failed verdict."""
    from paddle_llm_ops.kernel_checks import load_checks

    try:
        fn = load_checks()[name]
    except Exception as e:
        return ChildVerdict(False, f"the check raised {type(e).__name__}: {_first_line(e)}")
    args = [_CHILD_CODE, fn.__module__, fn.__qualname__, dtype, json.dumps(params)]
    try:
        proc = subprocess.run([python_executable(), "-c", *args], capture_output=True, text=True, timeout=timeout,
                              env=_child_env())
    except subprocess.TimeoutExpired:
        return ChildVerdict(False, f"the check did not finish within {timeout:.0f} s (in a child process)")
    except (OSError, RuntimeError) as e:  # no interpreter to start
        return ChildVerdict(False, f"the check process did not start: {e}")
    if proc.returncode < 0:
        return ChildVerdict(False, f"the check process died with {_signal_name(-proc.returncode)}")
    lines = [line[len(_MARK):] for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return ChildVerdict(False, f"the check process failed (exit {proc.returncode}: {tail[:200]})")
    result = json.loads(lines[-1])
    if "error" in result:
        return ChildVerdict(False, f"the check raised {result['error']} (in a child process)")
    verdict = judge(result["diff"], result["ref"], dtype, result.get("part", ""))
    return ChildVerdict(verdict.ok, verdict.detail + " (in a child process)")


def _child_main(argv: list[str]) -> None:
    """The child side of run_in_child: import the check, run it on the CPU, print one result line."""
    module, qualname, dtype, params = argv
    try:
        import paddle

        paddle.set_device("cpu")
        fn = importlib.import_module(module)
        for attr in qualname.split("."):
            fn = getattr(fn, attr)
        diff, ref, part = _measured(fn(dtype, **json.loads(params)))
        out = {"diff": diff, "ref": ref, "part": part}  # json writes NaN / Infinity and reads them back
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {_first_line(e)}"}
    sys.stdout.write(_MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: Paddle's exit has crashed after correct work before


# --------------------------------------------------------------------------------------------- cache
def cache_file() -> Path:
    """Where CPU verdicts are kept (see the module docstring)."""
    base = os.environ.get("PADDLE_LLM_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "paddle_llm")
    return Path(base) / "kernel_checks.json"


def cache_key(name: str, dtype: str, params: dict, paddle_version: str, cpu_model: str, cpu_flags) -> str:
    """The key of a CPU verdict: check, dtype, parameters, Paddle, CPU model and flags (hashed), the
    build of the kernel's library (BUILD_IDS) and the source of the check's module."""
    from paddle_llm_ops.kernel_checks import BUILD_IDS, load_checks

    fn = load_checks()[name]
    flags = hashlib.sha256(" ".join(sorted(cpu_flags)).encode()).hexdigest()[:16]
    try:
        source = hashlib.sha256(Path(inspect.getfile(fn)).read_bytes()).hexdigest()[:12]
    except (OSError, TypeError):
        source = "unknown"
    build = BUILD_IDS[name]() if name in BUILD_IDS else "-"
    extra = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return (f"{name}|{dtype}|{extra}|paddle {paddle_version}|{cpu_model}|flags {flags}|build {build}|"
            f"check {source}")


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, key: str, verdict: ChildVerdict) -> None:
    cache = _read_cache(path)  # re-read: another rank may have written meanwhile
    cache[key] = {"ok": verdict.ok, "detail": verdict.detail}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as e:
        log.warning("cannot write the kernel-check cache %s (%s): the check runs again at the next start", path, e)


class PlaceVerifier:
    """The `verify(name, dtype, **params) -> ChildVerdict` of one place, for platform.plan.decide():
    on the CPU, verdicts come from the cache or a fresh run (then cached); on a device, the check
    runs in this process on the current device at every start. Isolated checks run in a child.
    Never raises. `timings` collects (name, seconds, cached) of each call (start-up cost log)."""

    def __init__(self, on_cpu: bool, paddle_version: str = "", cpu_model: str = "", cpu_flags=()):
        self.on_cpu, self.paddle_version, self.cpu_model, self.cpu_flags = on_cpu, paddle_version, cpu_model, cpu_flags
        self.timings: list[tuple[str, float, bool]] = []

    def __call__(self, name: str, dtype: str = "float32", **params) -> ChildVerdict:
        t0 = time.monotonic()
        verdict = self._verify(name, dtype, params)
        self.timings.append((name, time.monotonic() - t0, verdict.cached))
        log.debug("kernel check %s (%s %s): %s in %.3f s", name, dtype, params, verdict, time.monotonic() - t0)
        return verdict

    def _run(self, name: str, dtype: str, params: dict) -> ChildVerdict:
        from paddle_llm_ops.kernel_checks import ISOLATED

        return run_in_child(name, dtype, **params) if name in ISOLATED else run_check(name, dtype, **params)

    def _verify(self, name: str, dtype: str, params: dict) -> ChildVerdict:
        if not self.on_cpu:
            return self._run(name, dtype, params)
        try:
            key = cache_key(name, dtype, params, self.paddle_version, self.cpu_model, self.cpu_flags)
        except Exception as e:  # no such check, or its library does not load: nothing to cache
            return ChildVerdict(False, f"the check raised {type(e).__name__}: {_first_line(e)}")
        path = cache_file()
        entry = _read_cache(path).get(key)
        if entry is not None:
            return ChildVerdict(bool(entry["ok"]), str(entry["detail"]), cached=True)
        verdict = self._run(name, dtype, params)
        if "did not finish within" not in verdict.detail:
            _write_cache(path, key, verdict)
        return verdict
