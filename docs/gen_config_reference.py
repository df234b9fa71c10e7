"""Render docs/reference/configuration.md from the code, the one place the settings are documented.

    .venv/bin/python docs/gen_config_reference.py          # write the page (make docs runs this)
    .venv/bin/python docs/gen_config_reference.py --check  # exit 1 if the checked-in page is stale

Sources, read as they are:
- the `llm` model's config.pbtxt parameters: EngineConfig's fields (backend/paddle_llm_engine/config.py)
  and ServingOptions' (backend/paddle_llm_triton/config_params.py), which config_params accepts;
  each documented by its entry in the class's docstring ("name: text", continuation lines
  indented), its default from the dataclass, and the value the shipped
  model_repository/llm/config.pbtxt sets with the comment beside it;
- the environment of `make serve`: the "Environment:" header of scripts/serve.sh, and the
  argparse definitions of scripts/launch_triton.py and backend/paddle_llm_openai/cli.py (read with
  `ast`, so what the builder's shell has set never leaks into the page).

tests/unit/test_config_reference.py fails when a parameter has no docstring entry, when an entry
names no parameter, when a variable the launcher or the frontend reads is not on the page, or when
the page is stale.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import html
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "reference" / "configuration.md"
PBTXT = REPO / "model_repository" / "llm" / "config.pbtxt"
SERVE_SH = REPO / "scripts" / "serve.sh"
LAUNCH_PY = REPO / "scripts" / "launch_triton.py"
OPENAI_CLI = REPO / "backend" / "paddle_llm_openai" / "cli.py"

ENTRY = re.compile(r"^    ([a-z][a-z0-9_]*(?: / [a-z][a-z0-9_]*)*): (.*)$")


def docstring_entries(doc: str) -> dict[str, str]:
    """"name: text" entries of a class docstring (4-space indent, continuation lines deeper) ->
    {name: text joined into one paragraph}; "a / b: text" documents both a and b."""
    out: dict[str, str] = {}
    names: list[str] = []
    for line in doc.splitlines():
        m = ENTRY.match(line)
        if m:
            names = m.group(1).split(" / ")
            for n in names:
                out[n] = m.group(2).strip()
        elif names and line.startswith("        ") and line.strip():
            for n in names:
                out[n] += " " + line.strip()
        else:
            names = []
    return out


@dataclasses.dataclass
class Param:
    name: str
    kind: str          # "engine", "serving" or "deprecated"
    type: str
    default: str
    doc: str | None
    shipped: str | None = None       # the value model_repository/llm/config.pbtxt sets
    shipped_note: str = ""           # the comment beside it


def shipped_parameters() -> dict[str, tuple[str, str]]:
    """model_repository/llm/config.pbtxt: {key: (string_value, the comment on that line)}."""
    out = {}
    pat = re.compile(r'parameters\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}\s*\}\s*(?:#\s*(.*))?$')
    for line in PBTXT.read_text().splitlines():
        m = pat.match(line.strip())  # a commented-out line lists a parameter, it does not set it
        if m:
            out[m.group(1)] = (m.group(2), (m.group(3) or "").strip())
    return out


ENGINE_PY = REPO / "backend" / "paddle_llm_engine" / "config.py"
PARAMS_PY = REPO / "backend" / "paddle_llm_triton" / "config_params.py"


def _module_constants(path: Path) -> dict[str, ast.AST]:
    """Top-level NAME = <expr> of a module, and NAME -> the module file for `from pkg.mod import NAME`."""
    out: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("paddle_llm_"):
            top, *rest = node.module.split(".")
            src = REPO / "backend" / top / Path(*rest).with_suffix(".py") if rest else REPO / "backend" / top / "__init__.py"
            if not src.is_file():  # a package: its names come from its __init__.py
                src = src.with_suffix("") / "__init__.py"
            for alias in node.names:
                out.setdefault(alias.asname or alias.name, src)  # resolved lazily (a Path)
    return out


def _value(node: ast.AST, consts: dict) -> object:
    """The value of a constant expression of the source: literals, arithmetic on them, and names of
    module constants (also imported ones)."""
    if isinstance(node, ast.Name):
        target = consts[node.id]
        if isinstance(target, Path):
            return _value(ast.Name(id=node.id), _module_constants(target))
        return _value(target, consts)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "field":
        kw = {k.arg: k.value for k in node.keywords}
        if "default" in kw:
            return _value(kw["default"], consts)
        factory = ast.unparse(kw["default_factory"])
        return {"list": [], "dict": {}, "tuple": ()}[factory]
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    env = {n: _value(ast.Name(id=n), consts) for n in names}
    return eval(compile(ast.fix_missing_locations(ast.Expression(node)), "<default>", "eval"), {"__builtins__": {}}, env)


def dataclass_fields(path: Path, cls_name: str) -> tuple[list[tuple[str, str, object]], str]:
    """A dataclass of a source file, read with ast (no import: the engine package imports Paddle):
    ([(field, type, default or MISSING)], its docstring). InitVar fields are left out, as
    dataclasses.fields() does."""
    tree = ast.parse(path.read_text())
    consts = _module_constants(path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    out = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            ann = ast.unparse(node.annotation)
            if ann.startswith("InitVar"):
                continue
            default = _value(node.value, consts) if node.value is not None else dataclasses.MISSING
            out.append((node.target.id, ann, default))
    return out, ast.get_docstring(cls, clean=False) or ""


def _default_text(v: object) -> str:
    if v is dataclasses.MISSING:
        return '""'
    if isinstance(v, (list, tuple)):
        return '""' if not v else ",".join(map(str, v))
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


TYPE_NAMES = {"list[int]": "ids", "tuple[str, ...]": "names"}


def deprecated_aliases() -> dict[str, str]:
    return _value(ast.Name(id="DEPRECATED_ALIASES"), _module_constants(ENGINE_PY))  # type: ignore[return-value]


def parameters() -> list[Param]:
    """Every parameter config_params accepts, in the order of the classes' fields."""
    shipped = shipped_parameters()
    out = []
    engine_doc = {}
    for kind, path, cls in (("engine", ENGINE_PY, "EngineConfig"), ("serving", PARAMS_PY, "ServingOptions")):
        fields, doc = dataclass_fields(path, cls)
        docs = docstring_entries(doc)
        engine_doc = engine_doc or docs
        for name, ann, default in fields:
            out.append(Param(name, kind, TYPE_NAMES.get(ann, ann), _default_text(default), docs.get(name)))
    for old, new in deprecated_aliases().items():
        out.append(Param(old, "deprecated", "int", f"(alias of {new})", engine_doc.get(old)))
    for p in out:
        if p.name in shipped:
            p.shipped, p.shipped_note = shipped[p.name]
    return out


def documented_names() -> set[str]:
    """Names that have a docstring entry (to find entries that name no parameter)."""
    return {n for path, cls in ((ENGINE_PY, "EngineConfig"), (PARAMS_PY, "ServingOptions"))
            for n in docstring_entries(dataclass_fields(path, cls)[1])}


# ---- the environment ------------------------------------------------------------------------------

@dataclasses.dataclass
class EnvVar:
    names: list[str]
    text: str
    source: str


def serve_sh_environment() -> list[EnvVar]:
    """The "# Environment:" block of scripts/serve.sh's header: entries "#   NAME[ / NAME ...]  text"
    with continuation lines indented further."""
    out: list[EnvVar] = []
    inside = False
    for line in SERVE_SH.read_text().splitlines():
        if line.startswith("# Environment:"):
            inside = True
            continue
        if not inside:
            continue
        if not line.startswith("#") or line.strip() == "#":
            break
        m = re.match(r"^#   ([A-Z][A-Z0-9_]*(?: / [A-Z][A-Z0-9_]*)*)\s+(.*)$", line)
        if m:
            out.append(EnvVar(m.group(1).split(" / "), m.group(2).strip(), "scripts/serve.sh"))
        elif out:
            out[-1].text += " " + line.lstrip("#").strip()
    return out


@dataclasses.dataclass
class Option:
    flags: list[str]
    default: str
    env: str | None
    help: str


def _literal(node: ast.AST) -> str:
    try:
        v = ast.literal_eval(node)
    except (ValueError, SyntaxError):
        return ast.unparse(node)
    return repr(v) if isinstance(v, str) else str(v)


def argparse_options(path: Path, env_constants: dict[str, str] | None = None) -> list[Option]:
    """add_argument(...) calls of a file, read with ast: flags, default (an `env.get("NAME", d)`
    default gives NAME and d), help (an f-string's constant parts; {NAME_ENV} constants filled in)."""
    tree = ast.parse(path.read_text())
    consts = dict(env_constants or {})
    for node in ast.walk(tree):  # module-level NAME = "VALUE" constants (e.g. BODY_ENV)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            consts[node.targets[0].id] = node.value.value
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        if not flags:
            continue
        kw = {k.arg: k.value for k in node.keywords}
        env_name, default = None, ""
        d = kw.get("default")
        for sub in ast.walk(d) if d is not None else []:
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "get" \
                    and sub.args and isinstance(sub.args[0], ast.Constant):
                env_name = sub.args[0].value
                default = _literal(sub.args[1]) if len(sub.args) > 1 else ""
                break
        else:
            if d is not None:
                default = _literal(d)
        if kw.get("action") is not None and isinstance(kw["action"], ast.Constant) and kw["action"].value == "store_true":
            default = "off"
        out.append(Option(flags, default, env_name, _help_text(kw.get("help"), consts)))
    return out


def _help_text(node: ast.AST | None, consts: dict[str, str]) -> str:
    if node is None:
        return ""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name):
                parts.append(consts.get(v.value.id, v.value.id))
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _help_text(node.left, consts) + _help_text(node.right, consts)
    return ast.unparse(node)


def environment_names() -> set[str]:
    """Every environment variable name the page documents."""
    names = {n for v in serve_sh_environment() for n in v.names}
    names |= {o.env for o in argparse_options(LAUNCH_PY) if o.env}
    names |= set(re.findall(r"\b[A-Z][A-Z0-9_]{3,}\b", " ".join(o.help for o in argparse_options(OPENAI_CLI))))
    return names


# ---- rendering ------------------------------------------------------------------------------------

DOC_PATH = re.compile(r"\bdocs/([a-z0-9_/]+\.md)\b")


def md(text: str) -> str:
    """Plain docstring text -> Markdown: HTML-escaped (gcu:<id>), table pipes escaped, docs/... paths
    as links relative to this page."""
    text = html.escape(text, quote=False).replace("|", "\\|").replace("*", "\\*")

    def link(m: re.Match) -> str:
        target = m.group(1)
        rel = Path("..", target).as_posix() if not target.startswith("reference/") else Path(target).name
        return f"[{target}]({rel})"
    return DOC_PATH.sub(link, text)


INTRO = """\
# Configuration reference

<!-- Generated by docs/gen_config_reference.py from the code: edit the docstrings, not this page.
     tests/unit/test_config_reference.py fails when it is stale. -->

The `llm` model's settings are the `parameters` of
[`model_repository/llm/config.pbtxt`](https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_configuration.md#model-parameters)
(`parameters { key: "max_num_seqs" value: { string_value: "16" } }`). This page is generated from
the code that reads them: the docstrings of `EngineConfig` (`backend/paddle_llm_engine/config.py`,
the engine settings, also the fields of the offline API's `EngineConfig`) and `ServingOptions`
(`backend/paddle_llm_triton/config_params.py`, serving options of the Triton model only), the
dataclasses' defaults, and the values the shipped `config.pbtxt` sets.

Rules (`paddle_llm_triton/config_params.py`):

- Unknown parameters are an error at load; the message lists the accepted names.
- An empty value means the default.
- Environment variables never override a parameter. The only fallback: `model_dir` empty ->
  `$PADDLE_LLM_MODEL_DIR` (set by `make serve` from `MODEL_DIR`). `preprocessing` has its own
  `model_dir` (the tokenizer) with the same fallback.
- At start the log prints the KV cache size (blocks, tokens in flight, MiB, and which setting it
  came from) and the resulting max concurrent tokens.

## Instances

`instance_group [ { count: N kind: KIND_CPU } ]` gives N stub processes, each with its own engine
and KV cache (metrics carry `instance="llm_0_k"`). Triton gives every KIND_CPU instance device id 0,
so the device comes from the instance's position k: `gcu_device_ids` when set, else `device_id` when
set, else k (instance k on `gcu:k`; on CPU the id is unused); with `tensor_parallel_size` N the
instance's ranks take that device and the next N - 1 (default: instance k on devices k\\*N ..
k\\*N + N - 1). Each instance sizes its KV cache on its own, so lower `kv_cache_memory_bytes` /
`num_kv_blocks` (and `num_threads` on CPU) when running several. `tests/e2e/test_e2e_instances.py`
runs two instances.
"""


def _shown(value: str) -> str:
    return value if value else '""'


def render() -> str:
    params = parameters()
    lines = [INTRO, "## Parameters of `llm`", "",
             "Kind: **engine** (an `EngineConfig` field), **serving** (`ServingOptions`: how the Triton "
             "model serves, not the engine) or **deprecated** (an old name still accepted). "
             "*Shipped*: the value in `model_repository/llm/config.pbtxt` (blank: not set there, so the "
             "default applies).", "",
             "| parameter | kind | type | default | shipped |", "|---|---|---|---|---|"]
    for p in params:
        shipped = f"`{_shown(p.shipped)}`" if p.shipped is not None else ""
        lines.append(f"| [`{p.name}`](#{p.name}) | {p.kind} | {p.type} | `{p.default}` | {shipped} |")
    lines.append("")
    for p in params:
        lines += [f"### `{p.name}`", ""]
        meta = f"*{p.kind}, {p.type}, default `{p.default}`"
        if p.shipped is not None:
            meta += f"; shipped `{_shown(p.shipped)}`"
        lines += [meta + "*", ""]
        lines += [md(p.doc) if p.doc else "**Not documented.**", ""]
        if p.shipped_note:
            lines += [f"In `config.pbtxt`: {md(p.shipped_note)}", ""]
    lines += render_environment()
    return "\n".join(lines).rstrip() + "\n"


def render_environment() -> list[str]:
    lines = ["## Environment of `make serve`", "",
             "`make serve` runs `scripts/serve.sh`, which execs `scripts/launch_triton.py`; the launcher "
             "starts tritonserver and, beside it, the OpenAI frontend (`python -m paddle_llm_openai`). "
             "These variables are read at start (`MODEL_DIR=/models/my-llama GRPC_PORT=9001 make serve`). "
             "From the header of `scripts/serve.sh`:", "",
             "| variable | meaning |", "|---|---|"]
    for v in serve_sh_environment():
        lines.append(f"| {' / '.join(f'`{n}`' for n in v.names)} | {md(v.text)} |")
    lines += ["", "### `scripts/launch_triton.py`", "",
              "Its options (what `serve.sh` passes; the environment variable, where one sets the default). "
              "Arguments after `--` go to tritonserver unchanged.", "",
              "| option | environment | default | meaning |", "|---|---|---|---|"]
    for o in argparse_options(LAUNCH_PY):
        env = f"`{o.env}`" if o.env else ""
        lines.append(f"| `{' '.join(o.flags)}` | {env} | {md(_short_default(o.default))} | {md(o.help)} |")
    lines += ["", "### The OpenAI frontend, `python -m paddle_llm_openai`", "",
              "Its options (`backend/paddle_llm_openai/cli.py`; the launcher passes the ports, the model "
              "folder, the served names and the drain grace, and the frontend inherits the launcher's "
              "environment: `VLLM_API_KEY`, `OPENAI_MAX_REQUEST_BODY_BYTES`).", "",
              "| option | default | meaning |", "|---|---|---|"]
    for o in argparse_options(OPENAI_CLI):
        lines.append(f"| `{' '.join(o.flags)}` | {md(_short_default(o.default))} | {md(o.help)} |")
    lines.append("")
    return lines


def _short_default(text: str) -> str:
    """A default as the page shows it: paths under the checkout relative to it."""
    if "REPO_ROOT" in text:
        return "the checkout's " + "/".join(re.findall(r"'([^']+)'", text))
    if "DEFAULT_BACKEND_DIR" in text:
        return "build/triton_backends"
    return text if text not in ("None", "") else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the page differs from what would be written")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(REPO)} is stale: run .venv/bin/python docs/gen_config_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    if not PAGE.is_file() or PAGE.read_text() != text:
        PAGE.write_text(text)
        print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
