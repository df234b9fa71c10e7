"""Dependencies run one way: the Triton adapter (paddle_llm_triton) imports the engine
(paddle_llm_engine), never the reverse, so an offline user of the engine loads no Triton code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parents[2] / "backend" / "paddle_llm_engine"
TRITON_MODULES = ("paddle_llm_triton", "triton_python_backend_utils")

_CHILD = """
import sys
import paddle_llm_engine.llm
loaded = sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1:])
print(" ".join(loaded))
"""


def test_importing_the_engine_loads_no_triton_module():
    """In a fresh interpreter (nothing imported before), the offline API pulls in no adapter module."""
    r = subprocess.run([sys.executable, "-c", _CHILD, *TRITON_MODULES], capture_output=True, text=True,
                       timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"paddle_llm_engine.llm imported Triton modules: {r.stdout.strip()}"


def test_no_engine_source_names_the_adapter():
    """Also lazy imports (inside functions) that the import above would not run."""
    offenders = [f"{p.relative_to(ENGINE_DIR)}: {name}" for p in sorted(ENGINE_DIR.rglob("*.py"))
                 for name in TRITON_MODULES if name in p.read_text(encoding="utf-8")]
    assert not offenders, offenders
