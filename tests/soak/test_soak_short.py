"""The 1.5-minute soak inside `make test`: the same code as `make soak` (run_soak.py, as a
subprocess with its own bound), 4 clients, the short mix and every fault kind (SIGKILL of the llm
stub, SIGKILL of a TP worker, a flood past the waiting limit, the SIGTERM drain), asserting the same
pass criteria: every check of its report.json must pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = REPO / "build" / "soak" / "short"
MINUTES = 1.5
BOUND_S = 15 * 60  # start-up, 1.5 minutes of traffic, restarts, the drain: far below this


def test_soak_three_minutes_all_faults(smollm2_dir):
    cmd = [sys.executable, str(HERE / "run_soak.py"), "--minutes", str(MINUTES), "--clients", "4",
           "--mix", "short", "--warmup-s", "10", "--fault-every-s", "30", "--faults", "stub,tp,flood,drain",
           "--model-dir", smollm2_dir, "--out", str(OUT)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=BOUND_S)
    except subprocess.TimeoutExpired as e:  # the soak's own watchdog should have ended it first
        pytest.fail(f"the soak did not end within {BOUND_S} s:\n{(e.stdout or '')[-4000:]}")
    report_path = OUT / "report.json"
    assert report_path.is_file(), f"no report (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
    report = json.loads(report_path.read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    lines = [f"{c['name']}: {c['detail']}" + "".join(f"\n    - {f}" for f in c["failures"][:4]) for c in failed]
    assert not failed, (f"{len(failed)} soak checks failed (report {report_path}, plot {OUT / 'soak.png'}):\n"
                        + "\n".join(lines))
    assert proc.returncode == 0, proc.stdout[-4000:]
