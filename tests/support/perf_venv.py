"""build/perf-venv: aiperf in a venv of its own (pinned AIPERF_PIN; about 1.2 GB, 1-2 minutes of pip on
a fresh machine, then a stamp makes it instant). `start()` begins the install in the background, so
that a test session that will run aiperf overlaps the download with its earlier tests (tests/conftest.py
calls it once collection is done); `ensure()` waits for that install, or installs now."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PERF_VENV = REPO / "build" / "perf-venv"
AIPERF_PIN = "aiperf==0.13.0"
PIP_TIMEOUT_S = 1800
_LOG = PERF_VENV.parent / "perf-venv-install.log"
_started: dict = {}


def _base_python() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def ready() -> bool:
    stamp = PERF_VENV / ".aiperf-pin"
    return (PERF_VENV / "bin" / "aiperf").is_file() and stamp.is_file() and stamp.read_text().strip() == AIPERF_PIN


def _command() -> list[str]:
    py = PERF_VENV / "bin" / "python"
    make_venv = "" if py.is_file() else f"{_base_python()!s} -m venv {PERF_VENV!s} && "
    return ["bash", "-c", f"{make_venv}{py} -m pip install --disable-pip-version-check --no-compile -q {AIPERF_PIN}"]


def start() -> None:
    """Begin the install in the background unless aiperf is ready or an install already runs."""
    if ready() or "proc" in _started:
        return
    _LOG.parent.mkdir(parents=True, exist_ok=True)
    out = open(_LOG, "w")
    _started["t0"] = time.monotonic()
    _started["proc"] = subprocess.Popen(_command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out.close()


def ensure() -> tuple[Path, str]:
    """(the aiperf executable, a note on how it got there). Raises RuntimeError with pip's last lines
    when the install fails (PyPI is reachable on CI)."""
    if not ready():
        start()
        proc = _started["proc"]
        try:
            code = proc.wait(PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timed out"
        if code != 0:
            tail = "\n".join(_LOG.read_text(errors="replace").strip().splitlines()[-10:])
            raise RuntimeError(f"pip install {AIPERF_PIN} into {PERF_VENV} failed ({code}):\n{tail}")
        (PERF_VENV / ".aiperf-pin").write_text(AIPERF_PIN + "\n")
        return PERF_VENV / "bin" / "aiperf", (f"{AIPERF_PIN} installed into {PERF_VENV}, "
                                              f"{time.monotonic() - _started['t0']:.0f} s after it began")
    return PERF_VENV / "bin" / "aiperf", "already installed"
