"""Command line: `python -m paddle_llm_openai --tritonserver-url 127.0.0.1:8001 --tokenizer <model dir>
--host 127.0.0.1 --openai-port 9000 [--served-model-name NAME ...] [--model llm] [--reasoning-parser auto]`.

The option names follow Triton's own OpenAI frontend (server repo python/openai/openai_frontend/
main.py: --tritonserver-url, --tokenizer, --host, --openai-port, default 9000) so a user can switch
between them. Served names (GET /v1/models, the `model` field): --served-model-name as vLLM's, by
default the model folder's name (from --tokenizer) and the Triton model name (`llm`).

Drain: the first SIGTERM / SIGINT makes /health/ready 503 and refuses new /v1 requests with 503;
requests in flight (streams too) finish, at most --drain-grace seconds, then uvicorn stops (exit 0).
A second signal stops at once.

Who may call it (guards.py): `--api-key KEY [KEY ...]` or the environment variable VLLM_API_KEY (vLLM's
names; the variable keeps the key off the command line, which other processes can read) make every
route but /health, /health/ready and /metrics require `Authorization: Bearer KEY`.
`--max-request-body-bytes` (or OPENAI_MAX_REQUEST_BODY_BYTES; default 8 MiB) bounds a request's body:
above it, 413 before it is read.

Runtime LoRA loads (/v1/load_lora_adapter, lora.py) carry the server's LoRA admin key, read from the
environment variable PADDLE_LLM_LORA_ADMIN_KEY (the launcher sets the same one for its tritonserver).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

import uvicorn

from paddle_llm_openai.app import Frontend, build_app
from paddle_llm_openai.guards import DEFAULT_MAX_BODY_BYTES
from paddle_llm_openai.reasoning import check_parser_setting


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the frontend before stopping."""

    def __init__(self, config, fe: Frontend, grace_s: float):
        super().__init__(config)
        self.fe, self.grace_s = fe, grace_s

    def handle_exit(self, sig, frame):
        if self.fe.draining:  # second signal: uvicorn's own (a second SIGINT forces the exit)
            self.should_exit = True
            return super().handle_exit(sig, frame)
        self.fe.draining = True
        threading.Thread(target=self._drain, name="drain", daemon=True).start()

    def _drain(self):
        t0 = time.monotonic()
        while self.fe.in_flight > 0 and time.monotonic() - t0 < self.grace_s:
            time.sleep(0.05)
        left = self.fe.in_flight
        logging.getLogger("paddle_llm_openai").info(
            "drained in %.2f s (%d request(s) still in flight)", time.monotonic() - t0, left)
        self.should_exit = True


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m paddle_llm_openai",
                                 description="OpenAI API frontend for Triton's `llm` model")
    ap.add_argument("--tritonserver-url", default="127.0.0.1:8001", help="Triton's gRPC address (host:port)")
    ap.add_argument("--triton-metrics-url", default=None,
                    help="Triton's metrics URL re-exported on /metrics (default http://<host>:8002/metrics)")
    ap.add_argument("--model", default="llm", help="the Triton model to call (vLLM-backend contract)")
    ap.add_argument("--tokenizer", default=None, help="the model folder (chat template, config.json)")
    ap.add_argument("--served-model-name", nargs="+", default=None,
                    help="names clients use in `model` (default: the model folder's name and --model)")
    ap.add_argument("--reasoning-parser", default="auto",
                    help="thinking models: auto (llm's reasoning_parser), none (the raw text in content), or "
                         "qwen3 / ernie45 / deepseek_r1 (sent to llm per request); docs/features/reasoning.md")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--openai-port", type=int, default=9000)
    ap.add_argument("--drain-grace", type=float, default=30.0,
                    help="seconds requests in flight get to finish after SIGTERM")
    ap.add_argument("--uvicorn-log-level", default="warning")
    ap.add_argument("--access-log", action="store_true", help="log every request (off: it costs time per request)")
    ap.add_argument("--api-key", nargs="+", default=None,
                    help="keys clients must send as `Authorization: Bearer KEY` on every route but /health, "
                         "/health/ready and /metrics (default: the environment variable VLLM_API_KEY; "
                         "neither: no key needed)")
    ap.add_argument("--max-request-body-bytes", type=int, default=None,
                    help="largest request body in bytes; a larger one is answered 413 before it is read "
                         f"(default: the environment variable {BODY_ENV}, else 8388608 = 8 MiB)")
    return ap.parse_args(argv)


def served_names(args) -> list[str]:
    if args.served_model_name:
        return list(dict.fromkeys(args.served_model_name))
    names = [Path(args.tokenizer).resolve().name] if args.tokenizer else []
    return list(dict.fromkeys(names + [args.model]))


def api_keys(args, env=None) -> list[str]:
    """--api-key, else VLLM_API_KEY (one key), else none."""
    if args.api_key:
        return list(args.api_key)
    key = (os.environ if env is None else env).get(API_KEY_ENV, "")
    return [key] if key else []


API_KEY_ENV = "VLLM_API_KEY"
LORA_KEY_ENV = "PADDLE_LLM_LORA_ADMIN_KEY"  # the secret of llm's runtime LoRA loads (llm/lora_admin.py)
BODY_ENV = "OPENAI_MAX_REQUEST_BODY_BYTES"


def max_body_bytes(args, env=None) -> int:
    """--max-request-body-bytes, else OPENAI_MAX_REQUEST_BODY_BYTES, else 8 MiB. Raises ValueError
    naming the variable when it is not an integer."""
    if args.max_request_body_bytes is not None:
        return args.max_request_body_bytes
    raw = (os.environ if env is None else env).get(BODY_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BODY_BYTES
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{BODY_ENV} must be a whole number of bytes, got {raw!r}") from None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        reasoning_parser = check_parser_setting(args.reasoning_parser)
    except ValueError as e:
        print(f"paddle_llm_openai: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s openai %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /metrics scrape otherwise
    metrics_url = args.triton_metrics_url
    if metrics_url is None:
        host = args.tritonserver_url.rsplit(":", 1)[0]
        metrics_url = f"http://{host}:8002/metrics"
    fe = Frontend(args.tritonserver_url, args.model, served_names(args), args.tokenizer, metrics_url or None,
                  reasoning_parser, lora_key=os.environ.get(LORA_KEY_ENV, ""))
    keys = api_keys(args)
    try:
        app = build_app(fe, keys, max_body_bytes(args))
    except ValueError as e:
        print(f"paddle_llm_openai: {e}", file=sys.stderr, flush=True)
        return 2
    config = uvicorn.Config(app, host=args.host, port=args.openai_port, log_level=args.uvicorn_log_level,
                            access_log=args.access_log, timeout_graceful_shutdown=5, lifespan="on")
    server = DrainingServer(config, fe, args.drain_grace)
    print(f"paddle_llm_openai: OpenAI API on http://{args.host}:{args.openai_port}/v1 -> Triton "
          f"{args.tritonserver_url} model {args.model}; served names {', '.join(fe.served_names)}; "
          f"{'API key required' if keys else 'no API key required'}", flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
