"""Where tritonserver and its Python stub come from, the environment the server runs in, and free ports.

`server_env` is the one place that builds the server's environment: the venv's bin first on PATH
(that is how the stub finds the venv's site-packages; PYTHONPATH is ignored) and the base
interpreter's own lib directory first on LD_LIBRARY_PATH (so the stub does not mix a distribution
libpython with the venv's). The model folder reaches the llm model as env var PADDLE_LLM_MODEL_DIR;
its config parameter `model_dir`, when set to a non-empty value, wins over the variable. The secret of
runtime LoRA updates (admin_api.lora_admin_key) reaches it as PADDLE_LLM_LORA_ADMIN_KEY.

Only the standard library is used here.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import sysconfig
from pathlib import Path

from paddle_llm_launcher.admin_api import LORA_KEY_ENV, lora_admin_key

REPO_ROOT = Path(__file__).resolve().parents[2]  # the project is installed editable (scripts/setup.sh)
DEFAULT_BACKEND_DIR = REPO_ROOT / "build" / "triton_backends"
MODEL_DIR_ENV = "PADDLE_LLM_MODEL_DIR"


def pytriton_server_dir() -> Path:
    """`pytriton/tritonserver` inside the installed nvidia-pytriton wheel (found without importing it)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("nvidia-pytriton is not installed in this interpreter (run scripts/setup.sh)")
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


def tritonserver_binary() -> Path:
    """The wheel's tritonserver executable; FileNotFoundError when the wheel or the binary is missing."""
    path = pytriton_server_dir() / "bin" / "tritonserver"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    return path


def python_libdir() -> str:
    """The base interpreter's own lib directory (holds its libpython), also when running in a venv."""
    return sysconfig.get_config_var("LIBDIR") or str(Path(sys.base_prefix) / "lib")


def venv_bin() -> Path:
    """This interpreter's bin folder (the venv's when running in one)."""
    return Path(sys.prefix) / "bin"


def _prepend(path_list: str | None, first: str) -> str:
    parts = [p for p in (path_list or "").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first] + parts)


def server_env(model_dir: str | os.PathLike | None, base: dict | None = None,
               python_bin: str | os.PathLike | None = None) -> dict:
    """python_bin: the bin folder put first on PATH (the stub uses that venv's packages); default
    this interpreter's venv (tests pass a throw-away venv layered on it)."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = _prepend(env.get("PATH"), str(python_bin or venv_bin()))
    env["LD_LIBRARY_PATH"] = _prepend(env.get("LD_LIBRARY_PATH"), python_libdir())
    env.pop("PYTHONHOME", None)
    env[LORA_KEY_ENV] = lora_admin_key(env)
    if model_dir:
        env[MODEL_DIR_ENV] = str(Path(model_dir).resolve())
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on loopback (the OS picks it; tiny race until the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int = 3, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports (HTTP, gRPC, metrics)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return ports
