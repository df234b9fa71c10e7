"""The Python interpreter to start child processes with (tensor-parallel workers, kernel checks).

A leaf module (standard library only) so that both the executors and the platform layer can use it
without importing each other."""

from __future__ import annotations

import os
import shutil
import sys


def python_executable() -> str:
    """The interpreter for child processes: this one, unless this process is an embedding binary
    (Triton's Python-backend stub), then the `python3` its PATH finds (the venv's).

    Raises RuntimeError when no interpreter is found."""
    exe = sys.executable or ""
    if os.path.basename(exe).startswith("python"):
        return exe
    for cand in (os.path.join(sys.prefix, "bin", "python3"), shutil.which("python3")):
        if cand and os.path.isfile(cand):
            return cand
    raise RuntimeError(f"no Python interpreter found for the tensor-parallel workers (sys.executable {exe!r})")
