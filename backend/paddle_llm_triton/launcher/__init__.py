"""Start, watch and stop a real tritonserver with this repository (tests, benchmarks, `make serve`).

server.py: the `TritonServer` handle, `start_server`, `server_env` (the server's environment, built
only there); procs.py: the /proc and /dev/shm reading behind a clean stop. scripts/launch_triton.py
is the command-line front end (foreground mode).
"""

from paddle_llm_triton.launcher.server import (DEFAULT_BACKEND_DIR, MODEL_DIR_ENV, REPO_ROOT, TritonServer,
                                               free_port, free_ports, server_command, server_env, start_server)

__all__ = ["DEFAULT_BACKEND_DIR", "MODEL_DIR_ENV", "REPO_ROOT", "TritonServer", "free_port", "free_ports",
           "server_command", "server_env", "start_server"]
