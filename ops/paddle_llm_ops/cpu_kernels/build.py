"""Build the C++ CPU kernels once, cached by source hash (set-up step; stdlib only, no paddle import).

    python ops/paddle_llm_ops/cpu_kernels/build.py [--force] [--build-root DIR]

The extension is compiled with `paddle.utils.cpp_extension.load` in a child interpreter whose whole
output is captured: a failed compile raises BuildError (exit status 1 from the command line) whose
message carries the compiler's error lines, and the full log is kept next to the builds. The
library lands in `<build root>/paddle_llm_cpu_kernels-<hash>/paddle_llm_cpu_kernels.so`, where the
hash covers every file of csrc/, the compile and link flags, the paddlepaddle version and the Python
version; a second run with nothing changed only hashes the sources (tens of milliseconds).
The build root is `$PADDLE_LLM_CPU_KERNELS_DIR` if set, else `build/cpu_kernels` of this checkout.

OpenMP: the kernels' parallel regions link the OpenMP runtime the paddle wheel already loads
(`paddle/libs/libiomp5.so`, which also serves MKL and Paddle's own GOMP_* calls), so they share one
thread team with Paddle instead of adding a second spinning pool; without that file, GCC's libgomp.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXTENSION_NAME = "paddle_llm_cpu_kernels"
SRC_DIR = Path(__file__).resolve().parent / "csrc"
# -g0 overrides the -g of the default flags (smaller, faster build); -ffp-contract=off keeps every
# a * b + c that is not an explicit FMA intrinsic as two rounded operations on both ISA paths (the
# rotary output is then bit-identical to the composed Paddle ops, and the GEMV summation order is
# the documented one). No -march: AVX2 code is confined to functions with a target attribute.
CXX_FLAGS = ["-O3", "-g0", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
BUILD_TIMEOUT_S = 1800
_COMPILED_SUFFIXES = (".cc", ".cpp")
_HASHED_SUFFIXES = (".cc", ".cpp", ".h")


class BuildError(RuntimeError):
    """The C++ extension did not build; the message holds the compiler's error output."""


def default_build_root() -> Path:
    env = os.environ.get("PADDLE_LLM_CPU_KERNELS_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "build" / "cpu_kernels"


def _paddle_dir() -> Path | None:
    spec = importlib.util.find_spec("paddle")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def openmp_link_flags() -> list[str]:
    """Link flags selecting the OpenMP runtime (see the module docstring)."""
    pdir = _paddle_dir()
    if pdir is not None and (pdir / "libs" / "libiomp5.so").is_file():
        libs = str(pdir / "libs")
        return [f"-L{libs}", f"-Wl,-rpath,{libs}", "-l:libiomp5.so"]
    return ["-fopenmp"]


def _paddle_version() -> str:
    try:
        return importlib.metadata.version("paddlepaddle")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def source_files(src_dir: Path | None = None, suffixes: tuple[str, ...] = _COMPILED_SUFFIXES) -> list[Path]:
    """The translation units of src_dir (default SRC_DIR) or, with suffixes=_HASHED_SUFFIXES, every
    file the hash covers."""
    return sorted(p for p in Path(src_dir or SRC_DIR).iterdir() if p.suffix in suffixes and p.is_file())


def source_hash(src_dir: Path | None = None, cflags: list[str] | None = None, ldflags: list[str] | None = None) -> str:
    """sha256 over the sources (names and bytes), the flags, the paddle and Python versions."""
    h = hashlib.sha256()
    for p in source_files(src_dir, _HASHED_SUFFIXES):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(json.dumps([cflags or CXX_FLAGS, ldflags if ldflags is not None else openmp_link_flags(),
                         _paddle_version(), sys.version_info[:2]]).encode())
    return h.hexdigest()


def library_path(build_root: Path | None = None, name: str = EXTENSION_NAME, digest: str | None = None) -> Path:
    """Where the library for the current sources lives (it may not exist yet)."""
    root = Path(build_root) if build_root is not None else default_build_root()
    digest = digest or source_hash()
    return root / f"{name}-{digest[:16]}" / f"{name}.so"


_CHILD = r"""
import json, sys
a = json.loads(sys.argv[1])
from paddle.utils.cpp_extension import load
load(name=a["name"], sources=a["sources"], extra_cxx_cflags=a["cflags"], extra_ldflags=a["ldflags"],
     build_directory=a["build_dir"], verbose=True)
"""

_ERROR_LINE = re.compile(r"(\berror\b|undefined reference|No such file or directory|not found)", re.I)
# Python's own traceback of the failed setup.py run says nothing about the cause.
_NOISE = re.compile(r"^\s*(Traceback|File \"|raise |RuntimeError: Failed to run command)")


def _compiler_errors(log: str, limit: int = 60) -> str:
    lines = log.splitlines()
    picked = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line) and not _NOISE.match(line):
            picked.extend(x for x in lines[i:i + 3] if not _NOISE.match(x))  # the error and the source lines gcc prints under it
    seen, out = set(), []
    for line in picked:
        if line not in seen:
            seen.add(line)
            out.append(line)
    if not out:
        out = lines[-limit:]
    return "\n".join(out[:limit])


def build_extension(name: str, sources: list[Path], out_dir: Path, cflags: list[str] | None = None,
                    ldflags: list[str] | None = None, log_path: Path | None = None) -> Path:
    """Compile `sources` into out_dir/<name>.so with paddle.utils.cpp_extension (in a child
    interpreter). Returns the library path. Raises BuildError with the compiler's error lines (and
    the log's location) when the compile or the link fails."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-build-", dir=out_dir))
    args = {"name": name, "sources": [str(Path(s).resolve()) for s in sources], "cflags": list(cflags or CXX_FLAGS),
            "ldflags": list(ldflags if ldflags is not None else openmp_link_flags()), "build_dir": str(work)}
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], cwd=work, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=BUILD_TIMEOUT_S)
        log, code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        log, code = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), -1
        log += f"\n(build timed out after {BUILD_TIMEOUT_S} s)"
    if log_path is not None:
        Path(log_path).write_text(log)
    built = work / name / f"{name}.so"
    try:
        if code != 0 or not built.is_file():
            where = f" (full log: {log_path})" if log_path is not None else ""
            raise BuildError(f"building the C++ extension {name!r} from {', '.join(Path(s).name for s in sources)} "
                             f"failed (exit status {code}); compiler output{where}:\n{_compiler_errors(log)}")
        target = out_dir / f"{name}.so"
        os.replace(built, target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_built(force: bool = False, build_root: Path | None = None, quiet: bool = False) -> Path:
    """Build the kernels unless the library for the current sources exists. Returns its path.
    Raises BuildError (compiler output in the message) when the build fails; a failed build never
    leaves a library behind, so nothing can load a stale or partial one."""
    root = Path(build_root) if build_root is not None else default_build_root()
    digest = source_hash()
    lib = library_path(root, digest=digest)
    if lib.is_file() and not force:
        if not quiet:
            print(f"cpu kernels: up to date ({lib})")
        return lib
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not quiet:
        print(f"cpu kernels: building {lib.parent.name} (paddle.utils.cpp_extension, ~1 minute on 2 cores)", flush=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        build_extension(EXTENSION_NAME, source_files(), staging, log_path=root / f"{EXTENSION_NAME}-build.log")
        (staging / "BUILD_INFO.json").write_text(json.dumps({
            "hash": digest, "sources": [p.name for p in source_files()], "cflags": CXX_FLAGS,
            "ldflags": openmp_link_flags(), "paddle": _paddle_version(), "python": sys.version.split()[0],
            "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
        os.chmod(staging, 0o755)  # mkdtemp made it private; the server may run as another user
        if lib.parent.exists():
            shutil.rmtree(lib.parent)
        os.replace(staging, lib.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    # Older builds of other source versions are not needed any more.
    for old in root.glob(f"{EXTENSION_NAME}-*"):
        if old.is_dir() and old != lib.parent:
            shutil.rmtree(old, ignore_errors=True)
    if not quiet:
        print(f"cpu kernels: built {lib} in {time.perf_counter() - t0:.1f} s")
    return lib


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the cached library matches")
    ap.add_argument("--build-root", type=Path, default=None, help="default: $PADDLE_LLM_CPU_KERNELS_DIR or build/cpu_kernels")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    try:
        ensure_built(force=a.force, build_root=a.build_root, quiet=a.quiet)
    except BuildError as e:
        print(f"cpu kernels: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
