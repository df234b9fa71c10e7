"""Run one of deploy/'s installers of a Debian package (deploy/prometheus/install_prometheus.sh,
deploy/haproxy/install_haproxy.sh) for a test and return the binary it prints on its last line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def installed_binary(script: Path, what: str, timeout_s: float = 400.0) -> str:
    """Path of the binary `script` installed (its stdout's last line). Fails the test, naming the
    script, its exit code and stderr, when it fails or runs past timeout_s seconds."""
    try:
        p = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.name} did not finish within {timeout_s:.0f} s", pytrace=False)
    if p.returncode != 0:
        pytest.fail(f"no {what} ({script.relative_to(REPO)} exit {p.returncode}):\n{p.stderr.strip()}",
                    pytrace=False)
    return p.stdout.strip().splitlines()[-1]
