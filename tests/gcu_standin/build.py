"""Build the stand-in `gcu` CustomDevice plug-in and the stand-in `paddle-custom-gcu` package (tests only).

Nothing here is an Enflame GCU: the plug-in (standin_gcu.cc) registers Paddle custom device type
"gcu" backed by host memory, so that the engine's GCU code path runs on any machine. Used by the
session fixtures of tests/gcu/conftest.py; never by `make serve` or scripts/setup.sh.

- build_plugin() compiles standin_gcu.cc with the machine's g++ against the headers of the installed
  paddle wheel into build/gcu_standin/<hash>/ (hash of the source, the compiler, the flags and the
  headers' location), and returns that folder: point env CUSTOM_DEVICE_ROOT at it. A second call
  with nothing changed returns at once. A compile failure raises PluginBuildError carrying the
  compiler's output.
- write_standin_package(folder, version) writes an importable stand-in of the plug-in's Python side:
  `paddle_custom_gcu-<version>.dist-info/METADATA` (so importlib.metadata.version("paddle-custom-gcu")
  answers `version`) and module `paddle_custom_device.gcu` (full_version, tops_version "standin",
  git_commit_id, STANDIN = True). Put the folder on sys.path (PYTHONPATH for plain python children).
- make_stub_venv(folder, site_dirs) makes a throw-away venv (no pip) whose site-packages holds a
  .pth that adds `site_dirs` (each processed as a site dir, so their own .pth files work): for
  Triton's Python-backend stub, which ignores PYTHONPATH and finds packages through the venv first
  on PATH.

Also runnable: `python tests/gcu_standin/build.py` prints the plug-in folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SOURCE = HERE / "standin_gcu.cc"
BUILD_ROOT = REPO / "build" / "gcu_standin"
LIB_NAME = "libpaddle-custom-standin-gcu.so"
CXXFLAGS = ["-O2", "-fPIC", "-shared", "-std=c++17", "-DPADDLE_WITH_CUSTOM_DEVICE"]
DEFAULT_VERSION_SUFFIX = "+standin"


class PluginBuildError(RuntimeError):
    """The stand-in plug-in did not compile; the message holds the command and the compiler's output."""


def paddle_include_dir() -> Path:
    """`paddle/include` of the installed paddle wheel, found without importing paddle."""
    import importlib.util

    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        raise PluginBuildError("paddle is not installed in this interpreter: cannot find its C headers")
    inc = Path(list(spec.submodule_search_locations)[0]) / "include"
    if not (inc / "paddle" / "phi" / "backends" / "device_ext.h").is_file():
        raise PluginBuildError(f"{inc}/paddle/phi/backends/device_ext.h missing: this paddle build ships no "
                               f"CustomDevice headers")
    return inc


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise PluginBuildError("no C++ compiler found (g++ / c++ / $CXX)")
    return cxx


def _compiler_id(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PluginBuildError(f"cannot run {cxx} --version: {e}") from e


def build_plugin(build_root: Path | None = None, source: Path = SOURCE, timeout: float = 300.0) -> Path:
    """Compile (or reuse) the plug-in; returns the folder holding only its .so (CUSTOM_DEVICE_ROOT)."""
    build_root = Path(build_root or BUILD_ROOT)
    cxx = _compiler()
    inc = paddle_include_dir()
    src = Path(source).read_bytes()
    key = hashlib.sha256(b"\0".join([src, _compiler_id(cxx).encode(), " ".join(CXXFLAGS).encode(),
                                     str(inc).encode()])).hexdigest()[:16]
    out_dir = build_root / key
    lib = out_dir / LIB_NAME
    if lib.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # Compile beside the target, then rename: concurrent builders never see a half-written .so, and
    # the temporary file's name does not end in .so (Paddle loads every *.so in CUSTOM_DEVICE_ROOT).
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".tmp", dir=out_dir)
    os.close(fd)
    cmd = [cxx, *CXXFLAGS, f"-I{inc}", f"-I{inc / 'third_party'}", str(source), "-o", tmp]
    try:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise PluginBuildError(f"compiling the stand-in plug-in took over {timeout:.0f} s: {' '.join(cmd)}") from e
        if r.returncode != 0:
            raise PluginBuildError(f"compiling the stand-in gcu plug-in failed (exit {r.returncode}):\n"
                                   f"$ {' '.join(cmd)}\n{r.stderr}{r.stdout}")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not lib.is_file():
            try:
                out_dir.rmdir()  # leave no empty cache folder behind a failed build
            except OSError:
                pass
    return out_dir


def installed_paddle_version() -> str:
    import importlib.metadata as md

    return md.version("paddlepaddle")


def write_standin_package(folder: Path, version: str | None = None, commit: str = "standin") -> Path:
    """Write the stand-in `paddle-custom-gcu` distribution into `folder` (created; an older stand-in
    there is replaced). version None: the installed paddlepaddle's version + "+standin", which the
    engine's version matrix accepts. Returns the folder (the sys.path entry)."""
    folder = Path(folder)
    version = version or installed_paddle_version() + DEFAULT_VERSION_SUFFIX
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("paddle_custom_gcu-*.dist-info"):
        shutil.rmtree(old)
    dist = folder / f"paddle_custom_gcu-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        "Name: paddle-custom-gcu\n"
        f"Version: {version}\n"
        "Summary: TEST STAND-IN for the Enflame GCU plug-in (host memory, not an Enflame GCU)\n")
    (dist / "INSTALLER").write_text("tests/gcu_standin/build.py\n")
    (dist / "top_level.txt").write_text("paddle_custom_device\n")
    (dist / "RECORD").write_text("")
    pkg = folder / "paddle_custom_device"
    (pkg / "gcu").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""Stand-in of the paddle-custom-gcu package (tests only)."""\n')
    (pkg / "gcu" / "__init__.py").write_text(
        '"""Test stand-in of paddle_custom_device.gcu: NOT an Enflame GCU.\n\n'
        "The device type \"gcu\" comes from tests/gcu_standin/standin_gcu.cc (host memory) loaded through\n"
        'CUSTOM_DEVICE_ROOT; this module only carries the version attributes of the real plug-in."""\n\n'
        "STANDIN = True\n"
        f"full_version = {version!r}\n"
        f"version = {version.split('+')[0]!r}\n"
        'tops_version = "standin"\n'
        f"git_commit_id = {commit!r}\n\n\n"
        "def version_info():\n"
        "    return {\"full_version\": full_version, \"tops_version\": tops_version, "
        "\"git_commit_id\": git_commit_id, \"standin\": True}\n")
    return folder


def make_stub_venv(folder: Path, site_dirs: list[Path], python: str | None = None, timeout: float = 300.0) -> Path:
    """A venv without pip at `folder` whose site-packages adds `site_dirs` (in order) through a .pth
    line that calls site.addsitedir. Returns the venv's bin folder (put it first on PATH)."""
    folder = Path(folder)
    python = python or getattr(sys, "_base_executable", None) or sys.executable
    if not (folder / "pyvenv.cfg").is_file():
        r = subprocess.run([python, "-m", "venv", "--without-pip", str(folder)], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"python -m venv {folder} failed:\n{r.stderr}{r.stdout}")
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = folder / "lib" / ver / "site-packages"
    if not site.is_dir():
        raise RuntimeError(f"{site} missing after creating the venv")
    # One line starting with "import": site.py exec()s it (a comprehension would not see `site`).
    calls = "; ".join(f"site.addsitedir({str(Path(d).resolve())!r})" for d in site_dirs)
    (site / "zz_gcu_standin.pth").write_text(f"import site; {calls}\n")
    return folder / "bin"


def venv_site_packages() -> Path:
    """site-packages of the interpreter running this (the project's .venv under pytest)."""
    return Path(sysconfig.get_paths()["purelib"])


if __name__ == "__main__":
    print(build_plugin())
