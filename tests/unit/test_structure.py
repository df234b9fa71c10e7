"""Checks of the code's shape that anyone can run (issue "Structure II"), read from the sources with
`ast` (every import counts, also lazy ones inside functions):
- no function or method in backend/, ops/, model_repository/ is longer than 60 lines;
- the worker (paddle_llm_engine/worker/) and the model's tensor parallelism (paddle_llm_engine/tp/)
  never import each other, and neither imports the executors;
- a worker never sees a request: nothing in worker/ imports the sampler, Sequence, the scheduler or
  the request modules; the engine imports only the sampler's public names;
- (issue "Structure III") inside each package of backend/ and in ops/paddle_llm_ops, its sub-packages
  and root modules (each one node; the package's __init__.py one more) import each other without a
  cycle."""

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


def test_no_function_is_longer_than_60_lines():
    long = []
    for p in _python_files(ROOT / "backend", ROOT / "ops", ROOT / "model_repository"):
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
