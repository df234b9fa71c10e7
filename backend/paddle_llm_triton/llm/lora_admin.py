"""Runtime LoRA loads and unloads on every instance of `llm`, and the list of loaded adapters.

Transport (docs/features/lora.md, "OpenAI API"): a caller (the OpenAI frontend, a separate process
that talks to Triton over gRPC only) sends `llm` one request whose only input is `lora_admin`, a JSON
object {"action": "list" | "load" | "unload", "lora_name", "lora_path", "load_inplace", "key"}.
Triton hands it to one instance; that instance (the origin) checks it, applies it to its own engine,
and then to each sibling instance (each has its own engine in its own stub process) over the control
bus (engine_channel/control_bus.py: datagrams between the stubs of one server, accepted from the same
user only), waiting for every sibling's answer. When a sibling fails or does not answer in
FANOUT_TIMEOUT_S, the instances that applied it are put back as they were and the caller gets the
error: the adapters are the same on every instance whenever a load or an unload has answered.

Who may: "list" anyone who may infer (names and folders, nothing secret); "load" / "unload" only with
allow_runtime_lora_updating 1 and a `key` equal to the server's PADDLE_LLM_LORA_ADMIN_KEY (compared in
constant time), and a load only from a folder under lora_root (symbolic links resolved; the engine
is given the resolved folder). Error texts are vLLM's where vLLM has one ("The lora adapter 'x' has
already been loaded.", "... cannot be found.", "Loading lora x failed: No adapter found for p"), as
"<field>: <text>"; LoraAdminError.kind says how the frontend answers (invalid 400, not_found 404,
denied / failed 500).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
from typing import Callable

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_triton.engine_channel.control_bus import ask
from paddle_llm_triton.llm.lora_start import RuntimeLoraSettings
from paddle_llm_triton.llm.lora_tasks import NAME_PREFIX as TASK_PREFIX

log = logging.getLogger("llm")

ADMIN_INPUT = "lora_admin"
BUS_TYPE = "lora"
FANOUT_TIMEOUT_S = 10.0
MAX_NAME_CHARS = 256
MAX_PATH_BYTES = 2048  # a load op (two paths and a name) must fit one control datagram (8 KiB)


class LoraAdminError(Exception):
    """A refused or failed admin request: str() is "<field>: <message>"; kind: invalid, not_found,
    denied (no runtime updating, or a wrong key) or failed (a sibling failed or did not answer)."""

    def __init__(self, field: str, message: str, kind: str = "invalid"):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.kind = field, message, kind


def check_name(name) -> str:
    """A runtime adapter name: a non-empty string without whitespace or commas (lora_modules and the
    metrics' label lists separate names with them), not TensorRT-LLM's task names."""
    if not isinstance(name, str) or not name:
        raise LoraAdminError("lora_name", "Both 'lora_name' and 'lora_path' must be provided.")
    if len(name) > MAX_NAME_CHARS or any(c.isspace() or c == "," or not c.isprintable() for c in name):
        raise LoraAdminError("lora_name", f"{name[:MAX_NAME_CHARS]!r} is not a usable adapter name (at most "
                                          f"{MAX_NAME_CHARS} printable characters, no whitespace or commas)")
    if name.startswith(TASK_PREFIX):
        raise LoraAdminError("lora_name", f"names starting {TASK_PREFIX!r} are TensorRT-LLM's LoRA tasks")
    return name


def under_root(path, root: str) -> str:
    """The resolved folder of `path` (relative: under root); LoraAdminError naming lora_path when it
    resolves outside root (checked before anything is read there)."""
    if not isinstance(path, str) or not path:
        raise LoraAdminError("lora_path", "Both 'lora_name' and 'lora_path' must be provided.")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES or "\0" in path:
        raise LoraAdminError("lora_path", f"not a usable path (at most {MAX_PATH_BYTES} bytes, no NUL)")
    real = os.path.realpath(os.path.join(root, path))
    if len(real.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise LoraAdminError("lora_path", f"not a usable path (at most {MAX_PATH_BYTES} bytes, no NUL)")
    if os.path.commonpath([real, root]) != root:
        raise LoraAdminError("lora_path", f"{path!r} resolves outside lora_root ({root}): runtime-loaded adapters "
                                          f"must lie under it")
    return real


class LoraAdmin:
    """engine: this instance's LLMEngine; settings: RuntimeLoraSettings (None: loads and unloads
    refused); bus: its ControlBus (siblings = bus.peers); timeout_s: how long a sibling may take to
    answer. Register on_bus as the bus handler of BUS_TYPE."""

    def __init__(self, engine, settings: RuntimeLoraSettings | None, bus, timeout_s: float = FANOUT_TIMEOUT_S):
        self.engine, self.settings, self.bus, self.timeout_s = engine, settings, bus, timeout_s
        self._admin_lock = threading.Lock()  # one admin request of this origin at a time
        self._op_lock = threading.Lock()     # one local change at a time (origin or sibling)
        self._shown: dict[str, str] = {}     # name -> the path as its caller gave it (GET /v1/models root)

    # -- requests arriving through Triton --------------------------------------------------------------
    def handle(self, text: str, reply: Callable[[dict | None, LoraAdminError | None], None]) -> None:
        """Answer one lora_admin request: reply(result, None) or reply(None, error), exactly once, on
        a thread of its own (a fan-out waits for the siblings)."""
        def run():
            try:
                result, error = self.run(text), None
            except LoraAdminError as e:
                result, error = None, e
            except Exception as e:  # noqa: BLE001 - answered, never lost
                log.exception("lora_admin request failed")
                result, error = None, LoraAdminError(ADMIN_INPUT, f"{type(e).__name__}: {e}", "failed")
            reply(result, error)

        threading.Thread(target=run, name="llm-lora-admin", daemon=True).start()

    def run(self, text: str) -> dict:
        """The result of one lora_admin request (JSON text); raises LoraAdminError."""
        req = _parse(text)
        action = req.get("action")
        if action == "list":
            return {"adapters": self.adapters(), "runtime_updating": self.settings is not None}
        if action not in ("load", "unload"):
            raise LoraAdminError(ADMIN_INPUT, f"action must be list, load or unload, got {action!r}")
        self._check_allowed(req)
        with self._admin_lock:
            return self._load(req) if action == "load" else self._unload(req)

    def adapters(self) -> list[dict]:
        """The adapters served by name (TensorRT-LLM's task adapters left out), in load order."""
        return [{"name": a.name, "path": self._shown.get(a.name, a.path), "rank": a.rank, "lora_id": a.lora_id}
                for a in self.engine.list_loras() if not a.name.startswith(TASK_PREFIX)]

    def _check_allowed(self, req: dict) -> None:
        if self.settings is None:
            raise LoraAdminError(ADMIN_INPUT, "runtime LoRA updating is off (the llm parameter "
                                              "allow_runtime_lora_updating is 0)", "denied")
        key = req.get("key")
        if not isinstance(key, str) or not hmac.compare_digest(key.encode(), self.settings.key.encode()):
            raise LoraAdminError(ADMIN_INPUT, "refused: the request does not carry the server's "
                                              "PADDLE_LLM_LORA_ADMIN_KEY", "denied")

    def _loaded(self) -> dict[str, str]:
        return {a.name: a.path for a in self.engine.list_loras()}

    def _load(self, req: dict) -> dict:
        name = check_name(req.get("lora_name"))
        given = req.get("lora_path")
        path = under_root(given, self.settings.root)
        replace = bool(req.get("load_inplace"))
        if name in self._loaded() and not replace:
            raise LoraAdminError("lora_name", f"The lora adapter '{name}' has already been loaded. If you want to "
                                              f"load the adapter in place, set 'load_inplace' to True.")
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise LoraAdminError("lora_path", f"Loading lora {name} failed: No adapter found for {given}", "not_found")
        self._everywhere({"action": "load", "lora_name": name, "lora_path": path, "shown": given, "replace": replace})
        log.info("LoRA adapter %r loaded from %s on every instance", name, path)
        return {"message": f"Success: LoRA adapter '{name}' added successfully.", "adapters": self.adapters()}

    def _unload(self, req: dict) -> dict:
        name = req.get("lora_name")
        if not isinstance(name, str) or not name:
            raise LoraAdminError("lora_name", "'lora_name' needs to be provided to unload a LoRA adapter.")
        if name.startswith(TASK_PREFIX) or name not in self._loaded():
            raise LoraAdminError("lora_name", f"The lora adapter '{name}' cannot be found.", "not_found")
        self._everywhere({"action": "unload", "lora_name": name})
        log.info("LoRA adapter %r unloaded on every instance", name)
        return {"message": f"Success: LoRA adapter '{name}' removed successfully.", "adapters": self.adapters()}

    # -- one change, here and on every sibling ---------------------------------------------------------
    def _everywhere(self, op: dict) -> None:
        """Apply op here, then on every sibling; on any failure undo it where it was applied and raise."""
        mine = self.apply(op)
        if not mine["ok"]:
            raise LoraAdminError(mine["field"], mine["error"])
        targets = [(self.bus.model_name, p) for p in self.bus.peers]
        replies = ask(self.bus.server_pid, targets, {"type": BUS_TYPE, **op}, self.timeout_s) if targets else {}
        failed = [(inst, replies.get((model, inst))) for model, inst in targets
                  if not (replies.get((model, inst)) or {}).get("ok")]
        if not failed:
            return
        self.apply(mine["undo"])
        for model, inst in targets:
            r = replies.get((model, inst)) or {}
            if r.get("ok"):
                ask(self.bus.server_pid, [(model, inst)], {"type": BUS_TYPE, **r["undo"]}, self.timeout_s)
        inst, r = failed[0]
        if r is None:
            raise LoraAdminError(ADMIN_INPUT, f"llm instance {inst} did not answer within {self.timeout_s:g} s; "
                                              f"nothing was changed", "failed")
        raise LoraAdminError(r.get("field") or ADMIN_INPUT, f"{r.get('error')} (on llm instance {inst}; nothing "
                                                            f"was changed)")

    def apply(self, op: dict) -> dict:
        """Apply one change to this engine: {"ok": True, "undo": the op that reverts it} or {"ok":
        False, "field", "error"}. A load of a name loaded from the same folder, and an unload of a
        name not loaded, change nothing and succeed (a retried fan-out). An op marked "restore" (an
        undo) may name a folder outside lora_root: it puts back what was there."""
        action, name = op.get("action"), op.get("lora_name")
        if action == "noop":
            return {"ok": True, "undo": _NOOP}
        with self._op_lock:
            try:
                before, shown = self._loaded().get(name), self._shown.get(name)
                undo = _load_op(name, before, shown) if before is not None else _NOOP
                if action == "unload":
                    if before is not None:
                        self.engine.remove_lora(name)
                        self._shown.pop(name, None)
                    return {"ok": True, "undo": undo}
                path = op["lora_path"]
                if self.settings is not None and not op.get("restore"):  # a sibling checks the root too
                    under_root(path, self.settings.root)
                if before is not None and before != path and op.get("replace"):
                    self._replace(name, before, path)
                else:
                    self.engine.add_lora(name, path)
                if op.get("shown"):
                    self._shown[name] = op["shown"]
                return {"ok": True, "undo": undo if before is not None else {"action": "unload", "lora_name": name}}
            except (InvalidRequestError, LoraAdminError) as e:
                return {"ok": False, "field": e.field, "error": e.message}

    def _replace(self, name: str, old: str, new: str) -> None:
        """load_inplace: `name` from the folder `new` (requests already running finish on the old
        weights); the old folder is loaded back if the new one fails."""
        self.engine.remove_lora(name)
        try:
            self.engine.add_lora(name, new)
        except Exception:
            self.engine.add_lora(name, old)
            raise

    def on_bus(self, msg: dict) -> dict:
        """A sibling origin's change (or "list": names and folders, for diagnostics and tests; a list
        longer than a datagram goes unanswered): applied here; the reply names this instance."""
        me = {"type": BUS_TYPE, "model": self.bus.model_name, "instance": self.bus.instance_name}
        if msg.get("action") == "list":
            return {**me, "ok": True, "adapters": [(a["name"], a["path"]) for a in self.adapters()]}
        return {**me, **self.apply(msg)}


_NOOP = {"action": "noop"}


def _load_op(name: str, path: str, shown: str | None) -> dict:
    """The op that puts `name` back on the folder `path` (an undo)."""
    return {"action": "load", "lora_name": name, "lora_path": path, "shown": shown, "replace": True, "restore": True}


def _parse(text: str) -> dict:
    try:
        req = json.loads(text)
    except (TypeError, ValueError) as e:
        raise LoraAdminError(ADMIN_INPUT, f"not valid JSON ({e})") from None
    if not isinstance(req, dict):
        raise LoraAdminError(ADMIN_INPUT, "must be a JSON object {\"action\": ...}")
    return req
