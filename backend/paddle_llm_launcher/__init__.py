"""Start, watch and stop a real tritonserver with this repository (tests, benchmarks, `make serve`).

A package of its own beside the adapter (paddle_llm_triton): no Triton stub imports it, and it runs in
the process that starts tritonserver, not inside one. From the adapter it reads only what the two
sides share: the config.pbtxt parameter names (config_params, to check `--set` overrides), the
control bus and the abstract socket names (engine_channel/: the drain asks every instance, the
supervisor takes failure datagrams from its own user only) and the supervisor's state folder
(lifecycle/restarts); never the request rooms (llm/, ensemble/) nor metrics/.

- server.py: `start_server` (plain or supervised) and the tritonserver command line;
- handle.py: the `TritonServer` handle (readiness, restart, drain, a clean stop with a kill watchdog);
- environment.py: the server's environment (`server_env`, built only there), the binaries, free ports;
- procs.py: the /proc and /dev/shm reading behind a clean stop;
- supervisor.py: reload a model whose stub died or whose engine failed, or restart the server;
- gate.py: the readiness gate; shutdown.py: the drain; repository.py: Triton's model repository API;
- admin_api.py: who may call Triton's administrative APIs; overrides.py: `make serve --set` settings;
- frontend.py: the OpenAI API frontend process beside the server.

scripts/launch_triton.py is the command-line front end (foreground mode).
"""

from paddle_llm_launcher.environment import (DEFAULT_BACKEND_DIR, MODEL_DIR_ENV, REPO_ROOT, free_port, free_ports,
                                             server_env)
from paddle_llm_launcher.handle import TritonServer
from paddle_llm_launcher.server import server_command, start_server

__all__ = ["DEFAULT_BACKEND_DIR", "MODEL_DIR_ENV", "REPO_ROOT", "TritonServer", "free_port", "free_ports",
           "server_command", "server_env", "start_server"]
