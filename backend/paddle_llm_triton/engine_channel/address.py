"""Where an llm instance's engine channel listens, and how the ensemble finds the listening ones.

Address: the abstract Unix socket "\\0paddle_llm_engine/<tritonserver pid>/<model>/<instance>"
(unix_names.py: nothing on disk, gone with the process that holds it). Scoping by the server's pid
keeps two servers on one host apart. An instance that dies or is unloaded disappears from the
kernel's socket table; a reloaded one appears.
"""

from __future__ import annotations

import os

from paddle_llm_triton.engine_channel.unix_names import bound_names

PREFIX = "paddle_llm_engine"


def server_pid() -> int:
    """The tritonserver process: the parent of the stub process we run in."""
    return os.getppid()


def address(model: str, instance: str, pid: int | None = None) -> str:
    """The abstract socket address of `instance` of `model` under server `pid` (default ours)."""
    return f"\0{PREFIX}/{server_pid() if pid is None else pid}/{model}/{instance}"


def listening_instances(model: str, pid: int | None = None) -> list[str]:
    """Instance names of `model` whose engine channel is listening now, sorted."""
    return bound_names(f"{PREFIX}/{server_pid() if pid is None else pid}/{model}/", listening=True)
