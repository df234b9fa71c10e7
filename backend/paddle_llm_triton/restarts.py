"""How many times the launcher's supervisor has reloaded a model, as the model sees it when it starts.

The supervisor (launcher/supervisor.py) writes {model name: reloads} to restarts.json in its state
folder before each reload; tritonserver and its stubs get that folder in PADDLE_LLM_SUPERVISOR_STATE.
Without a supervisor (plain tritonserver) the count is 0.
"""

from __future__ import annotations

import json
import os
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
