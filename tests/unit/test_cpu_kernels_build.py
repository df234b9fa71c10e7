"""Build and load behaviour of the C++ CPU kernels: a compile error fails loudly with the compiler's
own message (never a silent fallback), the cached set-up step is fast, a missing library says to
run scripts/setup.sh."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import paddle_llm_ops.cpu_kernels as ck
from paddle_llm_ops.cpu_kernels import build

BROKEN = """
int plk_broken_probe(int x) {
  return x + plk_this_name_is_not_declared;
}
"""


@pytest.mark.slow
def test_broken_source_fails_with_the_compiler_message(tmp_path):
    src = tmp_path / "broken.cc"
    src.write_text(BROKEN)
    log = tmp_path / "build.log"
    with pytest.raises(build.BuildError) as err:
        build.build_extension("plk_broken_test", [src], tmp_path / "out", log_path=log)
    msg = str(err.value)
    assert "plk_this_name_is_not_declared" in msg and "was not declared" in msg, msg
    assert "broken.cc" in msg
    assert log.is_file() and "plk_this_name_is_not_declared" in log.read_text()
    assert not list((tmp_path / "out").glob("*.so"))  # nothing half-built is left to load


@pytest.mark.slow
def test_setup_entry_point_exits_nonzero_with_the_message(tmp_path, monkeypatch, capsys):
    src_dir = tmp_path / "csrc"
    src_dir.mkdir()
    (src_dir / "broken.cc").write_text(BROKEN)
    monkeypatch.setattr(build, "SRC_DIR", src_dir)
    assert build.main(["--build-root", str(tmp_path / "root")]) == 1
    err = capsys.readouterr().err
    assert "plk_this_name_is_not_declared" in err and "failed" in err
    assert not list((tmp_path / "root").glob(f"{build.EXTENSION_NAME}-*/*.so"))


def test_cached_setup_step_is_fast():
    """The library for the current sources exists (set-up built it): the command only hashes."""
    assert ck.library_path().is_file()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(Path(build.__file__))], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stdout
    assert elapsed < 1.0, f"cached build check took {elapsed:.2f} s"


def test_source_hash_follows_the_sources(tmp_path):
    copy = tmp_path / "csrc"
    shutil.copytree(build.SRC_DIR, copy)
    h0 = build.source_hash(copy)
    assert build.source_hash(copy) == h0 == build.source_hash()
    (copy / "common.h").write_text((copy / "common.h").read_text() + "\n// changed\n")
    assert build.source_hash(copy) != h0
    assert build.source_hash(copy, cflags=["-O2"]) != build.source_hash(copy)


def test_missing_library_says_run_setup(monkeypatch, tmp_path):
    monkeypatch.setattr(ck, "_loaded_path", None)
    monkeypatch.setattr(ck, "library_path", lambda: tmp_path / "nothing" / "paddle_llm_cpu_kernels.so")
    with pytest.raises(ck.KernelsNotBuiltError, match="run scripts/setup.sh"):
        ck.load()
    assert ck.available() is False
