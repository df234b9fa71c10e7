"""Who may call Triton's administrative APIs: the restricted-API policy the launcher starts
tritonserver with.

Triton's model-repository API loads a model whose files travel inside the request (`"file:1/model.py"`,
base64), so anyone who reaches the HTTP or gRPC port could run Python in a stub, or unload `llm`.
Triton's guard (2.41+, so 2.51 has it) is `--http-restricted-api` / `--grpc-restricted-protocol`:
the listed APIs answer only requests carrying one header with one value (HTTP 403 / gRPC UNAVAILABLE
otherwise, measured on 2.51). The launcher turns it on for every server it starts:

- restricted by default: `model-repository` (load / unload / index), `shared-memory` (a client that
  registers a region makes the server map it), `trace` and `logging` (they change what the server
  writes). Open: `health`, `metadata`, `inference`, `model-config`, `statistics` (clients,
  perf_analyzer and load balancers read them; nothing in them changes the server).
- the header value is a secret made per start (`secrets.token_urlsafe(32)`), known only to the launcher
  process (its supervisor, readiness gate and drain use it) and never logged; an operator who wants
  to call the API sets `TRITON_ADMIN_KEY` to a value of their own (e.g. from a Kubernetes Secret).
- `TRITON_RESTRICTED_APIS` changes the list (comma-separated Triton API names); `none` opens every API,
  which lets any client that reaches the ports run code in the server (docs/security.md).

Triton 2.51 reads the value from its command line only, so it is visible in /proc/<pid>/cmdline to
processes of the same host that may read that (same user or root, unless /proc is mounted hidepid).

Header names: HTTP clients send `ADMIN_HEADER`; gRPC clients send it prefixed `triton-grpc-protocol-`
(Triton's rule for gRPC metadata, `grpc_headers()`).

Runtime LoRA updates (the `llm` parameter allow_runtime_lora_updating) travel as inference requests
(the open `inference` API), so they carry a secret of their own: `lora_admin_key()`, the value of
PADDLE_LLM_LORA_ADMIN_KEY when the operator sets it, else one made once per launcher process. Every
tritonserver (server_env) and OpenAI frontend (frontend.py) this process starts gets it in its
environment, so a frontend and its server agree; it opens nothing but LoRA loads and unloads.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

ADMIN_HEADER = "paddle-llm-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
RESTRICTED_ENV = "TRITON_RESTRICTED_APIS"
KEY_ENV = "TRITON_ADMIN_KEY"
LORA_KEY_ENV = "PADDLE_LLM_LORA_ADMIN_KEY"  # the llm model and the OpenAI frontend read the same name
MIN_LORA_KEY_CHARS = 16
_process_lora_key: list[str] = []  # the key made for this process, once
# every API name Triton 2.51 accepts in the restricted-API flags (its --help)
TRITON_APIS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
               "statistics", "trace", "logging")
DEFAULT_RESTRICTED = ("model-repository", "shared-memory", "trace", "logging")
_SERVER_FLAGS = ("--http-restricted-api", "--grpc-restricted-protocol")


@dataclass(frozen=True)
class AdminAccess:
    """The restricted APIs of one tritonserver and the header value that opens them.

    apis: Triton API names (TRITON_APIS), empty = nothing restricted; key: the header value (str,
    URL-safe characters, never empty when apis is not). repr() hides the key."""

    apis: tuple[str, ...]
    key: str = field(repr=False)

    def server_args(self) -> list[str]:
        """tritonserver flags (empty when nothing is restricted)."""
        if not self.apis:
            return []
        spec = f"{','.join(self.apis)}:{ADMIN_HEADER}={self.key}"
        return [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]

    def http_headers(self) -> dict[str, str]:
        """Headers an HTTP client sends to call a restricted API ({} when nothing is restricted)."""
        return {ADMIN_HEADER: self.key} if self.apis else {}

    def grpc_headers(self) -> dict[str, str]:
        """gRPC metadata (tritonclient.grpc `headers=`) to call a restricted API."""
        return {GRPC_HEADER_PREFIX + ADMIN_HEADER: self.key} if self.apis else {}


def parse_apis(raw: str | None) -> tuple[str, ...]:
    """The value of TRITON_RESTRICTED_APIS -> API names. None / empty: DEFAULT_RESTRICTED; "none":
    (). Raises ValueError naming the variable for an unknown name."""
    raw = (raw or "").strip()
    if not raw:
        return DEFAULT_RESTRICTED
    if raw.lower() == "none":
        return ()
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = [n for n in names if n not in TRITON_APIS]
    if bad or not names:
        raise ValueError(f"{RESTRICTED_ENV}: unknown API name(s) {', '.join(bad) or raw!r}; use a comma-separated "
                         f"list of {', '.join(TRITON_APIS)}, or none")
    return tuple(dict.fromkeys(names))


def check_key(key: str) -> str:
    """An operator's TRITON_ADMIN_KEY: at least 16 characters from [A-Za-z0-9._~-] (it travels in a
    command-line flag `key=value` and an HTTP header). Raises ValueError naming the variable."""
    ok = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-")
    if len(key) < 16 or any(c not in ok for c in key):
        raise ValueError(f"{KEY_ENV}: must be at least 16 characters of letters, digits and . _ ~ - "
                         f"(got {len(key)} characters)")
    return key


def admin_access(env: dict | None = None, extra_args=()) -> AdminAccess:
    """The policy for one server start, from the environment (see the module doc). A per-start key
    unless TRITON_ADMIN_KEY is set. Raises ValueError for a bad variable, or when `extra_args` (the
    operator's own tritonserver flags) already restrict APIs: two sets of flags would disagree."""
    env = os.environ if env is None else env
    mine = [a for a in extra_args if str(a).split("=", 1)[0] in _SERVER_FLAGS]
    if mine:
        raise ValueError(f"{mine[0].split('=', 1)[0]} is set by the launcher (its supervisor needs the key): "
                         f"use {RESTRICTED_ENV} and {KEY_ENV} instead")
    apis = parse_apis(env.get(RESTRICTED_ENV))
    key = env.get(KEY_ENV, "")
    key = check_key(key) if key else secrets.token_urlsafe(32)
    return AdminAccess(apis, key)


def lora_admin_key(env: dict | None = None) -> str:
    """The secret runtime LoRA loads and unloads must carry (module doc): PADDLE_LLM_LORA_ADMIN_KEY
    from `env` (default os.environ) when set, else this process's own (made once, so every server and
    frontend started here share it). Raises ValueError naming the variable for a key under 16 characters."""
    key = (os.environ if env is None else env).get(LORA_KEY_ENV, "")
    if key:
        if len(key) < MIN_LORA_KEY_CHARS:
            raise ValueError(f"{LORA_KEY_ENV}: must be at least {MIN_LORA_KEY_CHARS} characters (got {len(key)})")
        return key
    if not _process_lora_key:
        _process_lora_key.append(secrets.token_urlsafe(32))
    return _process_lora_key[0]
