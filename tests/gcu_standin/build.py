"""Build the stand-in `gcu` CustomDevice plug-in and the stand-in `paddle-custom-gcu` package (tests only).

Nothing here is an Enflame GCU: the plug-in registers Paddle custom device type "gcu" backed by host
memory (standin_gcu.cc) with collectives between the rank processes of one host (standin_xccl.cc:
the xccl_* callbacks of Paddle's `xccl` backend over POSIX shared memory, ECCL's place on a real
GCU) and, in the same .so, reference implementations of paddle-custom-gcu's LLM custom ops under
their real names and signatures (standin_ops_*.cc), so that the engine's GCU code path, tensor
parallelism included, runs on any machine. Used by the session fixtures of tests/gcu/conftest.py; never by
`make serve` or scripts/setup.sh.

- build_plugin(variant="good" | "broken") compiles the sources with the machine's g++ against the
  headers of the installed paddle wheel into build/gcu_standin/<variant>-<hash>/ (hash of the
  sources and headers, the compiler, the flags (the variant's included), the headers' location and
  the paddle version), and returns that folder: point env CUSTOM_DEVICE_ROOT at it. A second call
  with nothing changed returns at once (hashing only). A compile or link failure raises
  PluginBuildError carrying the compiler's output. "broken": rms_norm_gcu is a stub returning
  garbage and flash_attn_var_len_gcu is registered without `softcap` and with an extra
  `head_size: int` (for the tests of the platform plan's signature and numerical checks).
- write_standin_package(folder, version) writes an importable stand-in of the plug-in's Python side:
  `paddle_custom_gcu-<version>.dist-info/METADATA` (so importlib.metadata.version("paddle-custom-gcu")
  answers `version`), module `paddle_custom_device.gcu` (full_version, tops_version "standin",
  git_commit_id, STANDIN = True) and `paddle_custom_device.gcu.ops` (standin_ops_module.py: registers
  the ops on import and wraps them under the real wheel's names). Put the folder on sys.path
  (PYTHONPATH for plain python children).
- make_stub_venv(folder, site_dirs) makes a throw-away venv (no pip) whose site-packages holds a
  .pth that adds `site_dirs` (each processed as a site dir, so their own .pth files work): for
  Triton's Python-backend stub, which ignores PYTHONPATH and finds packages through the venv first
  on PATH.

How Paddle finds custom ops that live in a CustomDevice plug-in (paddle 3.3.1, measured here; Paddle's
paddle/fluid/platform/init.cc LoadCustomDevice and custom_device_load.cc LoadCustomLib):
- At `import paddle`, Paddle dlopen()s every *.so in CUSTOM_DEVICE_ROOT and calls its InitPlugin
  (and InitPluginCustomEngine if present), then registers the phi kernels the .so declared with
  PD_REGISTER_PLUGIN_KERNEL. It does NOT register PD_BUILD_OP custom ops: dlopen runs their static
  initialisers (they land in Paddle's OpMetaInfoMap), but `core.eager._run_custom_op(name, ...)`
  answers "Can't find <name> in Eager OpMetaInfoMap ... LoadOpMetaInfoAndRegisterOp" until someone
  calls `paddle.utils.cpp_extension.extension_utils.load_op_meta_info_and_register_op(<path of the
  .so>)`. The real wheel does that when `paddle_custom_device.gcu.ops` is imported (its generated
  ops/__init__.py runs load_lib() over CUSTOM_DEVICE_ROOT); the stand-in's ops module does the same.
  One .so holds both the runtime and the ops, as the real libpaddle-custom-gcu.so; no second .so.
- Signatures as registered: `paddle.base.framework.OpProtoHolder.instance().get_op_proto(name)`
  (.inputs[i].name, with "@OPTIONAL" appended and .dispensable True for paddle::Optional inputs;
  .outputs[i].name; .attrs[i].name / .type, a paddle.base.proto.framework_pb2.AttrType value: INT,
  FLOAT, BOOLEAN, LONG (int64_t), ..., after dropping Paddle's default attrs op_role, op_role_var,
  op_namescope, op_callstack, op_device, with_quant_attr), and
  `paddle.base.core.eager._get_custom_operator_inplace_map(name)` -> {output index: input index}
  (reshape_and_cache_flash_gcu: {0: 2, 1: 3}). Both work only after the registration call above.

Linking: the ops use Paddle's C++ API (paddle::Tensor, device contexts, the op-meta registry). The
headers come from paddle/include (`paddle/phi/api/all.h`, not `paddle/extension.h`, which pulls in
pybind11 / Python.h and the PIR headers and compiles several times slower); the symbols from the
wheel's paddle/base/libpaddle.so, linked as paddle.utils.cpp_extension links (`-l:libpaddle.so`
under --no-as-needed) with an rpath to paddle/base (libpaddle.so finds libphi / libcommon through
its own rpath). When Paddle dlopen()s the plug-in, that DT_NEEDED entry resolves to the libpaddle.so
already loaded. Compile time (measured 2026-12-02 with g++ -O2 on this 2-core machine): about 10 s of
CPU for the five translation units (runtime 1.1 s, collectives 0.4 s, each op file ~3 s), 25-50 s
wall while other jobs load the machine; the link takes under a second. CI builds each variant once per clean machine; the
.so is ~280 KB.

Also runnable: `python tests/gcu_standin/build.py [good|broken]` prints the plug-in folder.
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
SOURCE = HERE / "standin_gcu.cc"  # the device runtime (InitPlugin); no paddle C++ API
XCCL_SOURCE = HERE / "standin_xccl.cc"  # its collectives (xccl_* over POSIX shared memory); no paddle C++ API
OP_SOURCES = (HERE / "standin_ops_attn.cc", HERE / "standin_ops_flash.cc", HERE / "standin_ops_quant_moe.cc")
OP_HEADERS = (HERE / "standin_ops.h",)
OPS_MODULE = HERE / "standin_ops_module.py"  # becomes paddle_custom_device/gcu/ops/__init__.py
BUILD_ROOT = REPO / "build" / "gcu_standin"
LIB_NAME = "libpaddle-custom-standin-gcu.so"
CXXFLAGS = ["-O2", "-fPIC", "-std=c++17", "-DPADDLE_WITH_CUSTOM_DEVICE", "-w"]
VARIANTS = {"good": [], "broken": ["-DSTANDIN_VARIANT_BROKEN"]}
DEFAULT_VERSION_SUFFIX = "+standin"


class PluginBuildError(RuntimeError):
    """The stand-in plug-in did not compile; the message holds the command and the compiler's output."""


def _paddle_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        raise PluginBuildError("paddle is not installed in this interpreter: cannot find its C headers")
    return Path(list(spec.submodule_search_locations)[0])


def paddle_include_dir() -> Path:
    """`paddle/include` of the installed paddle wheel, found without importing paddle."""
    inc = _paddle_dir() / "include"
    if not (inc / "paddle" / "phi" / "backends" / "device_ext.h").is_file():
        raise PluginBuildError(f"{inc}/paddle/phi/backends/device_ext.h missing: this paddle build ships no "
                               f"CustomDevice headers")
    return inc


def paddle_link_flags() -> list[str]:
    """Link the wheel's libpaddle.so (paddle/base), as paddle.utils.cpp_extension does (`-l:libpaddle.so`
    with --no-as-needed), with an rpath to it: the op bodies call Paddle's C++ API (tensor accessors,
    device contexts, the op-meta registry), whose symbols live there and in libphi / libcommon, which
    libpaddle.so pulls in through its own rpath."""
    base = _paddle_dir() / "base"
    if not (base / "libpaddle.so").is_file():
        raise PluginBuildError(f"{base}/libpaddle.so missing: cannot link the stand-in's custom ops")
    return [f"-L{base}", f"-Wl,-rpath,{base}", "-Wl,--no-as-needed", "-l:libpaddle.so", "-Wl,--as-needed"]


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


def _paddle_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("paddlepaddle")
    except md.PackageNotFoundError:
        return "unknown"


def cache_key(variant: str, sources: list[Path], cxx: str, inc: Path) -> str:
    """sha256 (16 hex digits) over the sources and headers (names and bytes), the compiler's identity,
    the flags (those of the variant included), the headers' location and the paddle version."""
    h = hashlib.sha256()
    for p in [*sources, *OP_HEADERS]:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    for part in (_compiler_id(cxx), " ".join(CXXFLAGS + VARIANTS[variant]), str(inc), _paddle_version()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def _compile_all(cxx: str, flags: list[str], sources: list[Path], work: Path, timeout: float) -> list[Path]:
    """Compile each source to an object in `work`, two at a time (the machine has two cores)."""
    objects, procs = [], []
    for src in sources:
        obj = work / (src.stem + ".o")
        cmd = [cxx, *flags, "-c", str(src), "-o", str(obj)]
        procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        objects.append(obj)
        if len(procs) >= 2 or src == sources[-1]:
            failures = []
            for c, p in procs:  # wait for every compiler of the batch before raising: none outlives us
                try:
                    out, _ = p.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
                    failures.append(f"compiling took over {timeout:.0f} s: {' '.join(c)}")
                    continue
                if p.returncode != 0:
                    failures.append(f"compiling the stand-in gcu plug-in failed (exit {p.returncode}):\n"
                                    f"$ {' '.join(c)}\n{out}")
            if failures:
                raise PluginBuildError("\n".join(failures))
            procs = []
    return objects


def build_plugin(build_root: Path | None = None, source: Path = SOURCE, timeout: float = 600.0,
                 variant: str = "good") -> Path:
    """Compile (or reuse) the plug-in; returns the folder holding only its .so (CUSTOM_DEVICE_ROOT).

    variant "good": every op computes its reference result. "broken": rms_norm_gcu is a stub that
    returns garbage and flash_attn_var_len_gcu is registered with a wrong signature (no `softcap`,
    an extra `head_size: int`). Each variant and source version has its own cache folder
    `<build_root>/<variant>-<hash>/`. Raises PluginBuildError (compiler output in the message) when
    the compile or the link fails, and ValueError for an unknown variant."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown stand-in variant {variant!r} (expected one of {', '.join(VARIANTS)})")
    build_root = Path(build_root or BUILD_ROOT)
    cxx = _compiler()
    inc = paddle_include_dir()
    sources = [Path(source), XCCL_SOURCE, *OP_SOURCES]
    out_dir = build_root / f"{variant}-{cache_key(variant, sources, cxx, inc)}"
    lib = out_dir / LIB_NAME
    if lib.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # Build in a private folder beside the target, then rename the .so into place: concurrent
    # builders never see a half-written .so, and no other file ending in .so ever appears in
    # out_dir (Paddle loads every *.so in CUSTOM_DEVICE_ROOT).
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=build_root))
    flags = [*CXXFLAGS, *VARIANTS[variant], f"-I{inc}", f"-I{inc / 'third_party'}", f"-I{HERE}"]
    try:
        objects = _compile_all(cxx, flags, sources, work, timeout)
        tmp = work / "plugin.tmp"
        cmd = [cxx, "-shared", *map(str, objects), "-o", str(tmp), *paddle_link_flags()]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise PluginBuildError(f"linking the stand-in gcu plug-in failed (exit {r.returncode}):\n"
                                   f"$ {' '.join(cmd)}\n{r.stderr}{r.stdout}")
        os.replace(tmp, lib)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not lib.is_file():
            try:
                out_dir.rmdir()  # leave no empty cache folder behind a failed build
            except OSError:
                pass
    return out_dir


def installed_paddle_version() -> str:
    return _paddle_version()


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
        'CUSTOM_DEVICE_ROOT; this module carries the version attributes of the real plug-in, and its ops\n'
        'submodule the wrappers of the custom ops (registering them on import, as the real one)."""\n\n'
        "STANDIN = True\n"
        f"full_version = {version!r}\n"
        f"version = {version.split('+')[0]!r}\n"
        'tops_version = "standin"\n'
        f"git_commit_id = {commit!r}\n\n\n"
        "def version_info():\n"
        "    return {\"full_version\": full_version, \"tops_version\": tops_version, "
        "\"git_commit_id\": git_commit_id, \"standin\": True}\n")
    (pkg / "gcu" / "ops").mkdir(exist_ok=True)
    shutil.copyfile(OPS_MODULE, pkg / "gcu" / "ops" / "__init__.py")
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
    print(build_plugin(variant=sys.argv[1] if len(sys.argv) > 1 else "good"))
