"""LoRA adapters through the OpenAI API, as vLLM's OpenAI server offers them.

- Every adapter Triton's `llm` serves (enable_lora 1: lora_modules, multi_lora.json, runtime loads) is
  a model: GET /v1/models lists it after the base names (object "model", `parent` the base model's
  first served name, `root` the adapter's folder as it was given); a completion or chat request whose
  `model` is an adapter's name runs with that adapter (`lora_name` in llm's sampling_parameters).
- POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"} and POST
  /v1/unload_lora_adapter {"lora_name"}: vLLM's routes, statuses and texts (200 with the text
  "Success: LoRA adapter 'x' added successfully."; 400 / 404 with vLLM's error body: "type"
  InvalidUserInput / BadRequestError / NotFoundError and "code" the HTTP status). They exist only
  when llm's allow_runtime_lora_updating is on, as vLLM's exist only with
  VLLM_ALLOW_RUNTIME_LORA_UPDATING: otherwise 404 "Not Found", as for any unknown route.

The adapter list comes from `llm` itself (a `lora_admin` "list" request over the same gRPC channel,
kept LIST_TTL_S and read again when a request names a model not in it), so adapters that another
frontend loaded are seen too. Loads and unloads go the same way with the server's LoRA admin key
(PADDLE_LLM_LORA_ADMIN_KEY in this process's environment; the launcher gives its servers and
frontends the same one): `llm` applies them to every instance before it answers.
"""

from __future__ import annotations

import re
import time

from paddle_llm_openai.errors import OpenAIError, classify
from paddle_llm_openai.triton_client import TritonError

LIST_TTL_S = 1.0
NOT_FOUND_TEXTS = ("cannot be found", "No adapter found")
_FIELD = re.compile(r"^([a-z_]+): (.*)$", re.S)  # llm's "<field>: <text>"


def _flag(config: dict | None, key: str) -> bool:
    raw = (((config or {}).get("parameters") or {}).get(key) or {}).get("string_value", "")
    return raw.strip().lower() in ("1", "true", "yes", "on")


def not_found_route() -> OpenAIError:
    """The answer to a route that does not exist (the app's own 404)."""
    return OpenAIError(404, "Not Found", code=None, type_="invalid_request_error")


def admin_error(message: str) -> OpenAIError:
    """llm's refusal of a lora_admin request ("<field>: <text>") -> vLLM's status and body: 404
    NotFoundError for an adapter or folder that is not there, 400 for a bad request (InvalidUserInput
    for vLLM's own checks, BadRequestError for an adapter llm cannot serve), 500 for a refusal of this
    frontend (its key) or a failed fan-out; a transport failure or a busy server as classify() says."""
    unavailable = classify(message)
    if unavailable.status == 503:
        return unavailable
    m = _FIELD.match(message)
    if m is None or m.group(1) == "lora_admin":
        return OpenAIError(500, m.group(2) if m else message, code=500, type_="InternalServerError")
    field, text = m.groups()
    if any(t in text for t in NOT_FOUND_TEXTS):
        return OpenAIError(404, text, param=field, code=404, type_="NotFoundError")
    vllm_check = "has already been loaded" in text or "must be provided" in text or "needs to be provided" in text
    return OpenAIError(400, text, param=field, code=400, type_="InvalidUserInput" if vllm_check else "BadRequestError")


class LoraAdapters:
    """The adapters of the `llm` behind frontend `fe` (app.Frontend); key: the LoRA admin key."""

    def __init__(self, fe, key: str = ""):
        self.fe, self.key = fe, key
        self._adapters: list[dict] = []
        self._read_at = -1.0

    @property
    def enabled(self) -> bool:
        """llm serves adapters (its enable_lora; read from its config once it was ready)."""
        return _flag(self.fe.llm_config, "enable_lora")

    @property
    def runtime_updating(self) -> bool:
        return self.enabled and _flag(self.fe.llm_config, "allow_runtime_lora_updating")

    async def adapters(self, refresh: bool = False) -> list[dict]:
        """[{"name", "path", "rank", "lora_id"}] as llm lists them ([] when it serves none)."""
        if not self.enabled:
            return []
        if refresh or time.monotonic() - self._read_at >= LIST_TTL_S:
            try:
                result = await self.fe.llm.admin({"action": "list"})
            except TritonError as e:
                raise classify(str(e)) from None
            self._adapters, self._read_at = list(result.get("adapters") or []), time.monotonic()
        return self._adapters

    def cached_names(self) -> list[str]:
        return [a["name"] for a in self._adapters] if self.enabled else []

    async def resolve(self, model: str) -> str | None:
        """The adapter `model` names, or None for a base name; 404 model_not_found for neither (the
        list is read again once before a name is called unknown)."""
        if model in self.fe.served_names:
            return None
        if self.enabled:
            for refresh in (False, True):
                if model in [a["name"] for a in await self.adapters(refresh)]:
                    return model
        names = self.fe.served_names + self.cached_names()
        raise OpenAIError(404, f"The model `{model}` does not exist (served: {', '.join(names)})", param="model",
                          code="model_not_found")

    async def load(self, name: str | None, path: str | None, inplace: bool = False) -> str:
        """POST /v1/load_lora_adapter; the success text, or raises OpenAIError."""
        if not self.runtime_updating:
            raise not_found_route()
        if not name or not path:
            raise OpenAIError(400, "Both 'lora_name' and 'lora_path' must be provided.", code=400,
                              type_="InvalidUserInput")
        if name in self.fe.served_names:
            raise OpenAIError(400, f"'{name}' is the name of the base model", param="lora_name", code=400,
                              type_="InvalidUserInput")
        return await self._admin({"action": "load", "lora_name": name, "lora_path": path, "load_inplace": inplace})

    async def unload(self, name: str | None) -> str:
        """POST /v1/unload_lora_adapter; the success text, or raises OpenAIError."""
        if not self.runtime_updating:
            raise not_found_route()
        if not name:
            raise OpenAIError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", code=400,
                              type_="InvalidUserInput")
        return await self._admin({"action": "unload", "lora_name": name})

    async def _admin(self, payload: dict) -> str:
        try:
            result = await self.fe.llm.admin({**payload, "key": self.key})
        except TritonError as e:
            raise admin_error(str(e)) from None
        self._adapters, self._read_at = list(result.get("adapters") or []), time.monotonic()
        return str(result.get("message", "Success"))
