"""Checks of the code's shape that anyone can run (issue "Structure II"), read from the sources with
`ast` (every import counts, also lazy ones inside functions):
- no function or method in backend/, ops/, model_repository/, scripts/, benchmarks/, client_examples/,
  deploy/ is longer than 60 lines, and no source file there (.py, .cc, .h, .sh) longer than 400;
- the worker (paddle_llm_engine/worker/) and the model's tensor parallelism (paddle_llm_engine/tp/)
  never import each other, and neither imports the executors;
- a worker never sees a request: nothing in worker/ imports the sampler, Sequence, the scheduler or
  the request modules; the engine imports only the sampler's public names;
- (issue "Structure III") inside each package of backend/ and in ops/paddle_llm_ops, its sub-packages
  and root modules (each one node; the package's __init__.py one more) import each other without a
  cycle; the Triton adapter keeps its rooms (llm/, ensemble/, engine_channel/, lifecycle/, contracts/,
  metrics/) apart as the tests below say, and the launcher is a package of its own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "backend" / "paddle_llm_engine"
OPS = ROOT / "ops" / "paddle_llm_ops"
MAX_FUNCTION_LINES = 60


def _python_files(*dirs: Path) -> list[Path]:
    return sorted(p for d in dirs for p in d.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every import statement in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [a.name for a in node.names]))
    return out


def _imported_modules(folder: Path) -> dict[str, list[str]]:
    """file (relative to the engine package) -> the paddle_llm_engine modules it imports."""
    return {str(p.relative_to(ENGINE)): [m for m, _ in _imports(p) if m.startswith("paddle_llm_engine")]
            for p in _python_files(folder)}


def _node_of(package: Path, path: Path) -> str:
    """The node a file of `package` belongs to: its sub-package, its root module, or "__init__"."""
    rel = path.relative_to(package)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _node_edges(package: Path) -> dict[str, dict[str, str]]:
    """{node: {node it imports: "file:line" of one such import}} among the nodes of `package`."""
    name = package.name
    nodes = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    nodes |= {p.stem for p in package.glob("*.py")}
    edges: dict[str, dict[str, str]] = {}
    for path in _python_files(package):
        src = _node_of(package, path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name.split(".") for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                base = node.module.split(".")
                # `from pkg import x`: x is a module of the package, else a name of its __init__
                targets = [base + [a.name] for a in node.names] if base == [name] else [base]
            else:
                assert not isinstance(node, ast.ImportFrom), f"{path}: relative import"
                continue
            for parts in targets:
                if parts[0] != name:
                    continue
                dst = parts[1] if len(parts) > 1 and parts[1] in nodes else "__init__"
                if dst != src:
                    edges.setdefault(src, {}).setdefault(dst, f"{path.relative_to(ROOT)}:{node.lineno}")
    return edges


def _cycles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


# Every folder of product and tool code (tests and the docs' generator are not held to these sizes).
SOURCE_FOLDERS = ("backend", "ops", "model_repository", "scripts", "benchmarks", "client_examples", "deploy")
SOURCE_SUFFIXES = {".py", ".cc", ".h", ".sh"}


def test_no_function_is_longer_than_60_lines():
    long = []
    for p in _python_files(*(ROOT / d for d in SOURCE_FOLDERS)):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def test_worker_and_tensor_parallel_model_do_not_import_each_other():
    worker = _imported_modules(ENGINE / "worker")
    tp = _imported_modules(ENGINE / "tp")
    bad = [f"{f}: {m}" for f, mods in worker.items() for m in mods
           if m.startswith(("paddle_llm_engine.tp", "paddle_llm_engine.executor"))]
    bad += [f"{f}: {m}" for f, mods in tp.items() for m in mods
            if m.startswith(("paddle_llm_engine.worker", "paddle_llm_engine.executor"))]
    assert not bad, bad
    assert all(m.startswith(("paddle_llm_engine.models", "paddle_llm_engine.tp")) for mods in tp.values() for m in mods)


def test_the_worker_never_sees_requests_and_the_engine_only_the_samplers_public_names():
    request_side = ("paddle_llm_engine.sampler", "paddle_llm_engine.sequence", "paddle_llm_engine.scheduler",
                    "paddle_llm_engine.request", "paddle_llm_engine.engine", "paddle_llm_engine.sampling_params")
    for folder in (ENGINE / "worker", ENGINE / "executor"):
        bad = [f"{f}: {m}" for f, mods in _imported_modules(folder).items() for m in mods if m.startswith(request_side)]
        assert not bad, bad
    from_sampler = [names for m, names in _imports(ENGINE / "engine.py") if m == "paddle_llm_engine.sampler"]
    assert from_sampler and all(not n.startswith("_") for names in from_sampler for n in names), from_sampler


def test_no_import_cycle_between_sub_packages_and_root_modules_of_any_package():
    packages = sorted(p.parent for p in (ROOT / "backend").glob("*/__init__.py")) + [OPS]
    assert any(p.name == "paddle_llm_engine" for p in packages), packages
    bad = []
    for package in packages:
        edges = _node_edges(package)
        for component in _cycles(edges):
            links = [f"{a} -> {b} ({edges[a][b]})" for a in component for b in edges.get(a, {}) if b in component]
            bad.append(f"{package.name}: {component}: {links}")
    assert not bad, bad


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}, "d": {"a": ""}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": ""}, "b": {}}) == []


# ---- the Triton adapter by role (issue "Structure III") ---------------------------------------------
ADAPTER = ROOT / "backend" / "paddle_llm_triton"
LAUNCHER = ROOT / "backend" / "paddle_llm_launcher"
ADAPTER_ROOMS = {"llm", "ensemble", "llmapi", "engine_channel", "lifecycle", "contracts", "metrics"}
ADAPTER_ROOT_MODULES = {"__init__", "config_params", "tensors", "errors"}  # shared by several rooms
MAX_FILE_LINES = 400


def _is_module(dotted: str) -> bool:
    """A module or package of ours (backend/ holds every package these tests look at)."""
    base = ROOT / "backend" / Path(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imported_names(path: Path) -> set[str]:
    """Every module the file imports: `from pkg import x` counts as pkg.x when x is a module, else pkg."""
    out = set()
    for m, names in _imports(path):
        subs = {f"{m}.{n}" for n in names if _is_module(f"{m}.{n}")}
        out |= subs if subs and len(subs) == len(names) else subs | {m}
    return out


def _room_imports(folder: Path, prefix: str) -> dict[str, set[str]]:
    """file (relative to ROOT) -> the imported modules that start with prefix."""
    return {str(p.relative_to(ROOT)): {m for m in _imported_names(p) if m == prefix or m.startswith(prefix + ".")}
            for p in _python_files(folder)}


def test_the_adapter_has_its_rooms_and_few_root_modules():
    rooms = {p.name for p in ADAPTER.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert rooms == ADAPTER_ROOMS
    assert {p.stem for p in ADAPTER.glob("*.py")} == ADAPTER_ROOT_MODULES
    # a stale __pycache__ of the old adapter/launcher/ may stay behind in a checkout: only sources count
    assert not (ADAPTER / "launcher" / "__init__.py").exists() and (LAUNCHER / "__init__.py").is_file()


def test_the_adapter_never_imports_the_launcher():
    for folder in (ADAPTER, ROOT / "model_repository"):
        bad = {f: ms for f, ms in _room_imports(folder, "paddle_llm_launcher").items() if ms}
        assert not bad, bad


def test_the_launcher_reads_only_what_it_shares_with_the_adapter():
    """Config parameter names, the control bus and socket names, the supervisor's state folder;
    never the request rooms (llm/, ensemble/) nor metrics/."""
    used = set().union(*_room_imports(LAUNCHER, "paddle_llm_triton").values())
    assert used == {"paddle_llm_triton.config_params", "paddle_llm_triton.engine_channel.control_bus",
                    "paddle_llm_triton.engine_channel.unix_names", "paddle_llm_triton.lifecycle.restarts"}, used


def test_the_request_rooms_do_not_import_each_other_and_lifecycle_imports_no_room():
    """llm/ and ensemble/ meet only on the engine channel's protocol; llmapi/ builds on ensemble/ (its
    pipeline), never on llm/, and ensemble/ knows nothing of it; lifecycle/ stands alone (the launcher
    imports it)."""
    for room, other in (("llm", "ensemble"), ("ensemble", "llm"), ("llm", "llmapi"), ("llmapi", "llm"),
                        ("ensemble", "llmapi")):
        bad = {f: ms for f, ms in _room_imports(ADAPTER / room, f"paddle_llm_triton.{other}").items() if ms}
        assert not bad, bad
    bad = {f: ms for f, ms in _room_imports(ADAPTER / "lifecycle", "paddle_llm_triton").items() if ms}
    assert not bad, bad


def test_no_source_file_is_longer_than_400_lines():
    files = sorted(p for d in SOURCE_FOLDERS for p in (ROOT / d).rglob("*")
                   if p.suffix in SOURCE_SUFFIXES and p.is_file() and "__pycache__" not in p.parts)
    assert any(p.suffix == ".cc" for p in files) and any(p.suffix == ".sh" for p in files), "the premise: all kinds read"
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in files
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES]
    assert not long, long
