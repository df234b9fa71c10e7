"""What a model and the launcher's supervisor tell each other through the supervisor's state folder
(PADDLE_LLM_SUPERVISOR_STATE, set for tritonserver and its stubs; unset under plain tritonserver).

- restart_count(model): the supervisor (paddle_llm_launcher/supervisor.py) writes {model name: reloads} to
  restarts.json there before each reload; the llm model reports it as llm_engine_restarts.
- notify_failure(...): an llm instance whose engine failed tells the supervisor at once (a datagram to
  the abstract socket named after the folder), so the reload starts within milliseconds instead of at
  the next metrics scrape (which stays as the fallback).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

STATE_ENV = "PADDLE_LLM_SUPERVISOR_STATE"
RESTARTS_FILE = "restarts.json"


def restart_count(model: str) -> int:
    """Reloads of `model` so far (0 when unsupervised or unreadable)."""
    folder = os.environ.get(STATE_ENV)
    if not folder:
        return 0
    try:
        return int(json.loads((Path(folder) / RESTARTS_FILE).read_text()).get(model, 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def supervisor_address(state_dir: str | os.PathLike) -> str:
    """The abstract datagram socket the supervisor of `state_dir` listens on."""
    return f"\0paddle_llm_supervisor/{Path(state_dir)}"


def notify_failure(model: str, instance: str, reason: str) -> bool:
    """Tell the supervisor (if any) that `instance` of `model` failed; True when it was sent."""
    folder = os.environ.get(STATE_ENV)
    if not folder:
        return False
    msg = json.dumps({"type": "failed", "model": model, "instance": instance, "reason": reason[:2000]})
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(msg.encode("utf-8"), supervisor_address(folder))
            return True
        except OSError:
            return False
