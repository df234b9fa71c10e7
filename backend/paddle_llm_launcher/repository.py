"""Triton's model repository API: which models are in which state, load and unload. Needs
`--model-control-mode explicit` for load / unload.

Measured on Triton 2.51: unload returns at once (the model is UNLOADING: readiness false, new
requests to it are refused with "unknown model"; requests in flight finish first); load blocks until
the model is READY or failed; `load` of a model that is already loaded with unchanged files does
nothing, so a reload is an unload, then a load.

Index and unload go over HTTP (standard library). Load goes over gRPC when the server's gRPC port is
known: Triton's HTTP server runs a load on one of its worker threads until the model is READY, and
every HTTP connection served by that thread (a `generate_stream` in flight included) stalls meanwhile
(measured: a stream's chunks held for the whole 3 s of a drain while the readiness gate's load was
pending); Triton's gRPC server runs a load on a thread of its own.
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

    def __init__(self, http_port: int, host: str = "127.0.0.1", headers: dict[str, str] | None = None,
                 grpc_port: int | None = None, grpc_headers: dict[str, str] | None = None):
        """grpc_port / grpc_headers: where load() goes (see the module doc); None: over HTTP."""
        self.base = f"http://{host}:{http_port}"
        self.headers = dict(headers or {})
        self.grpc_url = None if grpc_port is None else f"{host}:{grpc_port}"
        self.grpc_headers = dict(grpc_headers or {})

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
        """Load (blocks until READY, at most `timeout` seconds). Raises RepositoryError with Triton's
        reason (or the time-out)."""
        if self.grpc_url is None:
            self._post(f"/v2/repository/models/{model}/load", timeout=timeout)
            return
        self._grpc(lambda c: c.load_model(model, headers=self.grpc_headers, client_timeout=timeout))

    def unload(self, model: str, timeout: float = 30.0) -> None:
        """Unload (returns at once: the model is UNLOADING). Raises RepositoryError with Triton's reason."""
        if self.grpc_url is None:
            self._post(f"/v2/repository/models/{model}/unload", timeout=timeout)
            return
        self._grpc(lambda c: c.unload_model(model, headers=self.grpc_headers, client_timeout=timeout))

    def _grpc(self, call) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            call(client)
        except InferenceServerException as e:
            raise RepositoryError(e.message() or str(e)) from None
        finally:
            client.close()
