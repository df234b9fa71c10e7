"""Checks of the code's shape that anyone can run (issue "Structure II"), read from the sources with
`ast` (every import counts, also lazy ones inside functions):
- no function or method in backend/, ops/, model_repository/ is longer than 60 lines;
- the worker (paddle_llm_engine/worker/) and the model's tensor parallelism (paddle_llm_engine/tp/)
  never import each other, and neither imports the executors;
- a worker never sees a request: nothing in worker/ imports the sampler, Sequence, the scheduler or
  the request modules; the engine imports only the sampler's public names;
- no import cycle inside paddle_llm_ops, each subpackage and each root module one node (issue
  "Structure III")."""

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


def _ops_node(module: str) -> str | None:
    """The node of a paddle_llm_ops module: its subpackage or root module (None: the package itself
    or another package)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "paddle_llm_ops" and len(parts) > 1 else None


def test_the_ops_subpackages_and_modules_import_no_cycle():
    edges: dict[str, set[str]] = {}
    for p in _python_files(OPS):
        rel = p.relative_to(OPS).parts
        src = rel[0][:-3] if len(rel) == 1 else rel[0]
        for module, names in _imports(p):
            # `from paddle_llm_ops import cpu_kernels` imports the subpackage named
            targets = [f"{module}.{n}" for n in names] if module == "paddle_llm_ops" else [module]
            for dst in filter(None, map(_ops_node, targets)):
                if dst != src and ((OPS / dst).is_dir() or (OPS / f"{dst}.py").is_file()):
                    edges.setdefault(src, set()).add(dst)

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            for n in edges.get(todo.pop(), ()):
                if n == b:
                    return True
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return False

    cycles = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and reaches(b, a))
    assert not cycles, cycles
