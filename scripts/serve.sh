#!/usr/bin/env bash
# Run tritonserver (from the nvidia-pytriton wheel in .venv) in the foreground on loopback.
#   scripts/serve.sh [extra tritonserver args, e.g. --log-verbose 1]
# Environment:
#   MODEL_REPO    model repository (default model_repository)
#   MODEL_DIR     model folder for the llm model (default build/SmolLM2-135M-Instruct)
#   HTTP_PORT / GRPC_PORT / METRICS_PORT   (8000 / 8001 / 8002), all bound to BIND_ADDRESS (127.0.0.1)
#   OPENAI_PORT   the OpenAI API frontend beside tritonserver (default 9000; 0: none), on BIND_ADDRESS too
#   SERVED_MODEL_NAME   names the OpenAI frontend serves, space-separated (default: the model folder's
#                 name and llm)
#   TRITON_KILL_AFTER   watchdog seconds after SIGTERM before a SIGKILL (default 15)
#   DRAIN_GRACE_S       seconds the requests in flight get to finish after Ctrl-C / SIGTERM (default 30)
#   LLM_PARAMS    parameters of the llm model, space-separated KEY=VALUE (any config.pbtxt parameter,
#                 e.g. "quantization=wint8 speculative_method=ngram max_model_len=4096", and instances=N):
#                 served from a copy of the repository under build/serve_repository/, the tracked
#                 files untouched; an unknown key stops the start naming it
#   DRAIN_ACCEPT_S      seconds a drain keeps serving new requests after readiness turned false, for
#                 load balancers that learn of the drain from health checks (default 0: refuse at
#                 once; docs/deployment/scale_out.md); a bad value fails the start
#   BIND_ADDRESS  address of the Triton ports and the OpenAI frontend (default 127.0.0.1; the Docker
#                 images and Kubernetes manifests set 0.0.0.0: read docs/security.md first)
#   TRITON_RESTRICTED_APIS  Triton APIs that need the admin header (default
#                 model-repository,shared-memory,trace,logging; none: every API open)
#   TRITON_ADMIN_KEY    the admin header's secret (default: a new one per start, known only to the
#                 launcher; 16+ characters of A-Za-z0-9._~-)
#   VLLM_API_KEY  the key OpenAI clients must send as Authorization: Bearer (default: none needed)
#   PADDLE_LLM_LORA_ADMIN_KEY  the secret runtime LoRA loads and unloads carry (llm parameter
#                 allow_runtime_lora_updating; default: a new one per start, given to tritonserver and
#                 the OpenAI frontend only; 16+ characters)
#   OPENAI_MAX_REQUEST_BODY_BYTES  largest OpenAI request body, 413 above it (default 8388608)
#
# Model folder: nothing in the repository is rendered. MODEL_DIR reaches the server as the env var
# PADDLE_LLM_MODEL_DIR; the llm model's model.py uses its config.pbtxt parameter `model_dir` when that
# is set to a non-empty value, else PADDLE_LLM_MODEL_DIR. So an explicit config value always wins over
# the environment, and the shipped config leaves it empty so that MODEL_DIR works.
#
# scripts/launch_triton.py does the work (paddle_llm_launcher): the server's environment (venv
# bin first on PATH, so that the Python-backend stub finds the venv's site-packages; the base
# interpreter's lib dir first on LD_LIBRARY_PATH; PADDLE_LLM_MODEL_DIR from --model-dir), the backend
# directory build/triton_backends (made by scripts/setup.sh), start-up time until /v2/health/ready, and
# supervision (a model whose stub dies or whose engine fails is reloaded; docs/operations/reliability.md), and
# on Ctrl-C / SIGTERM the drain, then SIGTERM to tritonserver (--exit-timeout-secs 10), then after TRITON_KILL_AFTER
# seconds SIGKILL of the server and its stubs and removal of the shm regions it owned.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

MODEL_REPO=$(abspath "${MODEL_REPO:-$ROOT/model_repository}")
MODEL_DIR=$(abspath "${MODEL_DIR:-$ROOT/build/SmolLM2-135M-Instruct}")
VENV=$ROOT/.venv
PY=$VENV/bin/python

if [[ ! -x $PY || ! -e $ROOT/build/triton_backends/python/triton_python_backend_stub ]]; then
  echo "serve: run scripts/setup.sh (or make setup) first" >&2
  exit 1
fi

cd "$ROOT"
exec "$PY" "$ROOT/scripts/launch_triton.py" \
  --model-repo "$MODEL_REPO" \
  --model-dir "$MODEL_DIR" \
  --http-port "${HTTP_PORT:-8000}" \
  --grpc-port "${GRPC_PORT:-8001}" \
  --metrics-port "${METRICS_PORT:-8002}" \
  --openai-port "${OPENAI_PORT:-9000}" \
  --exit-timeout-secs 10 \
  --kill-after "${TRITON_KILL_AFTER:-15}" \
  --drain-grace "${DRAIN_GRACE_S:-30}" \
  -- "$@"
