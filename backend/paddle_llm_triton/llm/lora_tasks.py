"""TensorRT-LLM's LoRA task ids on one llm instance: the adapters that `ensemble` requests send as
lora_task_id + lora_weights + lora_config, cached by task id, as TensorRT-LLM's LoRA cache does.

The first request of a task sends its weights; they are checked against the base model
(contracts/trtllm_lora.py), written as a PEFT folder into this instance's own cache directory (one
subfolder per task id) and loaded into the engine as adapter "trtllm-task-<id>". Later requests
send only lora_task_id; an unknown id without weights is refused with TensorRT-LLM's message. A
cached task that is sent weights again keeps its cached ones (TensorRT-LLM's executor drops them).

Bound (TensorRT-LLM's lora_cache_host_memory_bytes): the task folders' bytes. Past it the least
recently used tasks that no request is running with are unloaded (engine.remove_lora) and their
folders removed; when only running tasks are left, a new task is refused as UNAVAILABLE
(TensorRT-LLM: "Cache is full. There are no done tasks to evict"). The directory is removed at
close(), and directories left by instances that died are removed at the next start.

The llmapi contract's lora_id / lora_name / lora_path name a PEFT folder on the server: served only
when the engine has loaded that folder already (lora_modules at start, or a runtime load); a
request never makes the server read a folder it names.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError
from paddle_llm_triton.contracts import trtllm_lora

log = logging.getLogger(__name__)

NAME_PREFIX = "trtllm-task-"
DIR_PREFIX = "paddle_llm_lora_tasks_"
MAX_TASK_ID = (1 << 64) - 1


class LoraCacheFull(RuntimeError):
    """Every cached task is in use and a new one does not fit: retry later (UNAVAILABLE)."""


@dataclass
class _Task:
    name: str
    folder: Path
    nbytes: int
    users: int = 0


def _remove_stale_dirs(root: Path) -> None:
    """Remove cache directories of instances whose process is gone (killed before close())."""
    for d in root.glob(DIR_PREFIX + "*"):
        try:
            pid = int(d.name[len(DIR_PREFIX):].split("_", 1)[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError, OSError):
            continue


class LoraTasks:
    """engine: the instance's LLMEngine (enable_lora 1); max_bytes: the cache bound; root: where the
    cache directory is made (default: the system's temporary directory)."""

    def __init__(self, engine, max_bytes: int, root: str | None = None):
        self.engine = engine
        self.max_bytes = max_bytes
        self.base = trtllm_lora.BaseShapes.of(engine.model_config)
        base_dir = Path(root or tempfile.gettempdir())
        _remove_stale_dirs(base_dir)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}_", dir=base_dir))
        self._tasks: OrderedDict[int, _Task] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()  # the table (the engine thread releases)
        self._load_lock = threading.Lock()  # one task written and loaded at a time

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(t.nbytes for t in self._tasks.values())

    def cached(self) -> list[int]:
        """The cached task ids, least recently used first."""
        with self._lock:
            return list(self._tasks)

    def acquire(self, lora: dict) -> str:
        """The engine adapter name a request's lora (the generate frame's "lora": task_id, and
        weights + config arrays, or path) runs with; the caller calls release(lora) when the request
        ends. Raises InvalidRequestError naming the input, LoraCacheFull."""
        if lora.get("path") is not None:
            return self._preloaded(str(lora["path"]), lora.get("ckpt_source"))
        task_id = _task_id(lora.get("task_id"))
        weights, config = lora.get("weights"), lora.get("config")
        pairs = None
        if weights is not None or config is not None:
            if weights is None or config is None:
                raise InvalidRequestError("lora_weights" if weights is None else "lora_config",
                                          "a request for LoRA inference must have both lora_weights and "
                                          "lora_config", ErrorCode.INVALID_LORA)
            pairs = trtllm_lora.to_pairs(weights, config, self.base, self.engine.config.max_lora_rank)
        if self._use(task_id):
            return NAME_PREFIX + str(task_id)
        if pairs is None:
            raise InvalidRequestError("lora_task_id", f"LoRA task {task_id} not found in cache. Please send LoRA "
                                                      f"weights with request", ErrorCode.INVALID_LORA)
        with self._load_lock:
            if self._use(task_id):  # loaded meanwhile by another request
                return NAME_PREFIX + str(task_id)
            self._load(task_id, pairs)
        return NAME_PREFIX + str(task_id)

    def release(self, lora: dict) -> None:
        """A request that acquire() served has ended."""
        if lora.get("path") is not None:
            return
        with self._lock:
            t = self._tasks.get(_task_id(lora.get("task_id")))
            if t is not None:
                t.users = max(0, t.users - 1)

    def _use(self, task_id: int) -> bool:
        with self._lock:
            t = self._tasks.get(task_id)
            if t is None:
                return False
            self._tasks.move_to_end(task_id)
            t.users += 1
            return True

    def _load(self, task_id: int, pairs: dict) -> None:
        need = sum(a.nbytes + b.nbytes for a, b in pairs.values())
        if need > self.max_bytes:
            raise InvalidRequestError("lora_weights", f"LoRA task {task_id}: {need} bytes of weights exceed the "
                                                      f"LoRA cache ({self.max_bytes} bytes: the llm parameter "
                                                      f"lora_cache_host_memory_bytes)", ErrorCode.INVALID_LORA)
        self._evict(need)
        folder = self.dir / str(task_id)
        name = NAME_PREFIX + str(task_id)
        try:
            nbytes = trtllm_lora.write_peft(folder, pairs)
            adapter = self.engine.add_lora(name, str(folder))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with self._lock:
            self._tasks[task_id] = _Task(name, folder, nbytes, users=1)
        log.info("LoRA task %d cached as adapter %r: rank %d, %d projections, %d bytes", task_id, name,
                 adapter.rank, len(adapter.modules), nbytes)

    def _evict(self, need: int) -> None:
        """Unload least recently used idle tasks until `need` more bytes fit; LoraCacheFull if not."""
        while True:
            with self._lock:
                used = sum(t.nbytes for t in self._tasks.values())
                if used + need <= self.max_bytes:
                    return
                victim = next((k for k, t in self._tasks.items() if t.users == 0), None)
                if victim is None:
                    raise LoraCacheFull(f"LoRA cache is full: {len(self._tasks)} cached tasks in use hold {used} of "
                                        f"{self.max_bytes} bytes (lora_cache_host_memory_bytes); there are no done "
                                        f"tasks to evict: retry later")
                t = self._tasks.pop(victim)
            self._drop(victim, t)

    def _drop(self, task_id: int, t: _Task) -> None:
        try:
            self.engine.remove_lora(t.name)
        except InvalidRequestError:
            pass  # not loaded (already removed)
        shutil.rmtree(t.folder, ignore_errors=True)
        log.info("LoRA task %d evicted from the cache (%d bytes)", task_id, t.nbytes)

    def _preloaded(self, path: str, source) -> str:
        """The adapter the engine loaded from folder `path` (llmapi lora_path), not one of the tasks."""
        if source not in (None, "", "hf"):
            raise InvalidRequestError("lora_ckpt_source", f"only 'hf' (a PEFT folder) is supported, got {source!r}",
                                      ErrorCode.INVALID_LORA)
        wanted = os.path.normpath(os.path.abspath(path))
        for a in self.engine.list_loras():
            if not a.name.startswith(NAME_PREFIX) and os.path.normpath(os.path.abspath(a.path)) == wanted:
                return a.name
        raise InvalidRequestError("lora_path", f"{path!r} is not the folder of an adapter this server has loaded "
                                               f"(the llm parameter lora_modules); a request cannot make the server "
                                               f"read a folder it names", ErrorCode.INVALID_LORA)

    def close(self) -> None:
        """Remove the cache directory (the engine is going away with its adapters)."""
        with self._lock:
            self._tasks.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def _task_id(value) -> int:
    try:
        task_id = int(value)
    except (TypeError, ValueError):
        raise InvalidRequestError("lora_task_id", f"must be an unsigned 64-bit integer, got {value!r}",
                                  ErrorCode.INVALID_LORA) from None
    if not 0 <= task_id <= MAX_TASK_ID or isinstance(value, bool):
        raise InvalidRequestError("lora_task_id", f"must be an unsigned 64-bit integer, got {value!r}",
                                  ErrorCode.INVALID_LORA)
    return task_id
