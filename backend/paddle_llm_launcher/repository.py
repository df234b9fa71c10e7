"""Triton's model repository API over HTTP (standard library only): which models are in which
state, load and unload. Needs `--model-control-mode explicit` for load / unload.

Measured on Triton 2.51: unload returns at once (the model is UNLOADING: readiness false, new
requests to it are refused with "unknown model"; requests in flight finish first); load blocks until
the model is READY or failed; `load` of a model that is already loaded with unchanged files does
nothing, so a reload is an unload, then a load.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class RepositoryError(RuntimeError):
    """Triton refused a repository request (its message)."""


class RepositoryClient:
    """headers: sent with every repository request (the launcher's admin header, admin_api.py: the
    repository API is restricted on the servers it starts)."""

    def __init__(self, http_port: int, host: str = "127.0.0.1", headers: dict[str, str] | None = None):
        self.base = f"http://{host}:{http_port}"
        self.headers = dict(headers or {})

    def _post(self, path: str, body: dict | None = None, timeout: float = 10.0):
        req = urllib.request.Request(self.base + path, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                data = r.read()
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read().decode()).get("error", str(e))
            except (ValueError, AttributeError):
                msg = str(e)
            raise RepositoryError(msg) from None
        return json.loads(data) if data else None

    def index(self, timeout: float = 5.0) -> dict[str, str]:
        """{model name: state} ("READY", "LOADING", "UNLOADING", "UNAVAILABLE", ...)."""
        return {m["name"]: m.get("state", "") for m in self._post("/v2/repository/index", timeout=timeout) or []}

    def load(self, model: str, timeout: float = 600.0) -> None:
        """Load (blocks until READY). Raises RepositoryError with Triton's reason."""
        self._post(f"/v2/repository/models/{model}/load", timeout=timeout)

    def unload(self, model: str, timeout: float = 30.0) -> None:
        self._post(f"/v2/repository/models/{model}/unload", timeout=timeout)
