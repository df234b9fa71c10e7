"""TensorRT-LLM's LoRA task cache of an llm instance (paddle_llm_triton/llm/lora_tasks.py) on the
engine's real adapter registry (paddle_llm_engine.lora.LoraRegistry: every folder the cache writes
is read and checked as the engine reads it): first request with weights, later ones by task id,
TensorRT-LLM's message for an unknown id, least-recently-used eviction past
lora_cache_host_memory_bytes with the adapter unloaded and its folder removed, tasks in use never
evicted, the directory removed at close and after a dead instance; the llmapi's lora_path; and the
frame's arrays decoded on the llm side (llm/ensemble_steps.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from lora_adapters import make_adapter
from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.lora import LoraRegistry
from paddle_llm_triton.contracts import trtllm_lora as tl
from paddle_llm_triton.engine_channel import protocol
from paddle_llm_triton.llm import lora_tasks as lt
from tiny_checkpoints import make_checkpoint


class RegistryEngine:
    """What LoraTasks uses of LLMEngine, on the engine's registry."""

    def __init__(self, cfg: ModelConfig, max_lora_rank: int = 16):
        self.model_config = cfg
        self.config = SimpleNamespace(max_lora_rank=max_lora_rank)
        self.registry = LoraRegistry(cfg, 4, max_lora_rank)
        self.removed: list[str] = []

    def add_lora(self, name, path):
        return self.registry.add(name, path)

    def remove_lora(self, name):
        self.removed.append(name)
        return self.registry.remove(name)

    def list_loras(self):
        return self.registry.adapters()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = make_checkpoint("llama_tied", tmp_path_factory.mktemp("llama") / "m")
    return d, ModelConfig.from_dir(str(d))


@pytest.fixture(scope="module")
def tensors(model, tmp_path_factory):
    """Three adapters' TensorRT-LLM tensors (q_proj and v_proj of both layers, rank 4)."""
    d, cfg = model
    out = []
    for seed in range(3):
        ad = make_adapter(d, tmp_path_factory.mktemp("ad") / str(seed), seed=seed, targets=("q_proj", "v_proj"), r=4)
        out.append(tl.from_peft(ad, cfg))
    return out


def lora(task_id, wc=None):
    return {"task_id": task_id, "weights": None if wc is None else wc[0], "config": None if wc is None else wc[1]}


def test_first_request_loads_later_ones_use_the_cache(model, tensors, tmp_path):
    _, cfg = model
    eng = RegistryEngine(cfg)
    tasks = lt.LoraTasks(eng, 1 << 20, root=str(tmp_path))
    assert tasks.acquire(lora(7, tensors[0])) == "trtllm-task-7"
    folder = tasks.dir / "7"
    assert (folder / "adapter_model.safetensors").is_file() and (folder / "adapter_config.json").is_file()
    adapter = eng.registry.get("trtllm-task-7")
    assert adapter.path == str(folder) and len(adapter.modules) == 4 and adapter.rank == 4
    assert tasks.acquire(lora(7)) == "trtllm-task-7"  # by id only
    # weights sent again for a cached task: checked, the cached ones kept (no second load)
    assert tasks.acquire(lora(7, tensors[1])) == "trtllm-task-7"
    assert eng.registry.get("trtllm-task-7").lora_id == adapter.lora_id
    with pytest.raises(InvalidRequestError) as ei:
        tasks.acquire(lora(8))
    assert str(ei.value) == "lora_task_id: LoRA task 8 not found in cache. Please send LoRA weights with request"
    tasks.close()
    assert not tasks.dir.exists()


def test_weights_without_config_and_bad_ids(model, tensors, tmp_path):
    eng = RegistryEngine(model[1])
    tasks = lt.LoraTasks(eng, 1 << 20, root=str(tmp_path))
    w, c = tensors[0]
    for entry, field in (({"task_id": 1, "weights": w, "config": None}, "lora_config"),
                         ({"task_id": 1, "weights": None, "config": c}, "lora_weights"),
                         ({"task_id": -1, "weights": w, "config": c}, "lora_task_id"),
                         ({"task_id": "x"}, "lora_task_id"),
                         ({"task_id": 2, "weights": w, "config": c[:, :, :2]}, "lora_config")):
        with pytest.raises(InvalidRequestError) as ei:
            tasks.acquire(entry)
        assert ei.value.field == field, entry
    assert tasks.cached() == [] and eng.list_loras() == []
    tasks.close()


def test_least_recently_used_idle_task_is_evicted_past_the_bound(model, tensors, tmp_path):
    eng = RegistryEngine(model[1])
    tasks = lt.LoraTasks(eng, 1 << 20, root=str(tmp_path))
    tasks.acquire(lora(1, tensors[0]))
    size = tasks.nbytes  # one task's folder
    tasks.release(lora(1))
    tasks.max_bytes = 2 * size + size // 2  # two tasks fit, not three
    tasks.acquire(lora(2, tensors[1]))
    tasks.release(lora(2))
    tasks.acquire(lora(1))  # 1 is now the most recently used
    tasks.release(lora(1))
    tasks.acquire(lora(3, tensors[2]))
    assert tasks.cached() == [1, 3] and eng.removed == ["trtllm-task-2"]
    assert not (tasks.dir / "2").exists() and (tasks.dir / "3").is_dir()
    with pytest.raises(InvalidRequestError, match="LoRA task 2 not found in cache"):
        tasks.acquire(lora(2))
    # 1 and 3 in use: a fourth task does not fit and nothing can go
    tasks.acquire(lora(1))
    with pytest.raises(lt.LoraCacheFull, match="no done tasks to evict"):
        tasks.acquire(lora(4, tensors[1]))
    assert tasks.cached() == [3, 1] and not (tasks.dir / "4").exists()
    tasks.release(lora(3))
    assert tasks.acquire(lora(4, tensors[1])) == "trtllm-task-4"
    assert tasks.cached() == [1, 4] and eng.removed[-1] == "trtllm-task-3"
    tasks.close()


def test_an_adapter_above_the_bound_is_refused(model, tensors, tmp_path):
    tasks = lt.LoraTasks(RegistryEngine(model[1]), 1000, root=str(tmp_path))
    with pytest.raises(InvalidRequestError, match="lora_cache_host_memory_bytes") as ei:
        tasks.acquire(lora(1, tensors[0]))
    assert ei.value.field == "lora_weights"
    tasks.close()


def test_rank_above_max_lora_rank_is_refused(model, tensors, tmp_path):
    tasks = lt.LoraTasks(RegistryEngine(model[1], max_lora_rank=2), 1 << 20, root=str(tmp_path))
    with pytest.raises(InvalidRequestError, match="max_lora_rank") as ei:
        tasks.acquire(lora(1, tensors[0]))
    assert ei.value.field == "lora_config"
    tasks.close()


def test_directories_of_dead_instances_are_removed_at_start(model, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{lt.DIR_PREFIX}{int(dead.stdout)}_abc"
    live = tmp_path / f"{lt.DIR_PREFIX}{os.getpid()}_abc"
    for d in (stale, live):
        (d / "1").mkdir(parents=True)
    tasks = lt.LoraTasks(RegistryEngine(model[1]), 1 << 20, root=str(tmp_path))
    assert not stale.exists() and live.exists()
    assert tasks.dir.parent == tmp_path and tasks.dir.name.startswith(f"{lt.DIR_PREFIX}{os.getpid()}_")
    tasks.close()


def test_llmapi_lora_path_serves_only_adapters_loaded_at_start(model, tmp_path):
    d, cfg = model
    eng = RegistryEngine(cfg)
    folder = make_adapter(d, tmp_path / "sql", seed=5, targets=("o_proj",), r=2)
    eng.add_lora("sql", str(folder))
    tasks = lt.LoraTasks(eng, 1 << 20, root=str(tmp_path))
    entry = {"task_id": 3, "name": "any", "path": str(folder) + "/", "ckpt_source": "hf"}
    assert tasks.acquire(entry) == "sql"
    tasks.release(entry)
    for path, source, field in ((str(tmp_path / "other"), "hf", "lora_path"), (str(folder), "nemo", "lora_ckpt_source")):
        with pytest.raises(InvalidRequestError) as ei:
            tasks.acquire({"task_id": 3, "name": "x", "path": path, "ckpt_source": source})
        assert ei.value.field == field
    assert [a.name for a in eng.list_loras()] == ["sql"]
    tasks.close()


def test_frame_arrays_round_trip_exactly(tensors):
    w, c = tensors[0]
    for arr in (w, c, np.array([[7]], np.uint64)):
        back = protocol.decode_array(protocol.encode_array(arr), "x")
        assert back.dtype == arr.dtype and back.shape == arr.shape and back.tobytes() == arr.tobytes()
    for bad in ({"dtype": "object", "shape": [1], "data": ""}, {"dtype": "float16", "shape": [3], "data": "AAAA"},
                {"dtype": "float16", "shape": [1], "data": "!!"}, "nope"):
        with pytest.raises(ValueError, match="^lora_weights: not an encoded array"):
            protocol.decode_array(bad, "lora_weights")


def test_llmapi_lora_inputs_map_onto_the_frame():
    from paddle_llm_triton.llmapi import contract

    def t(v, dtype=object):
        return np.array([v], dtype=dtype)

    full = {"lora_id": t(3, np.uint64), "lora_name": t(b"sql"), "lora_path": t(b"/models/sql")}
    assert contract.lora_request(full) == {"task_id": 3, "name": "sql", "path": "/models/sql", "ckpt_source": "hf"}
    assert contract.lora_request({**full, "lora_ckpt_source": t(b"nemo")})["ckpt_source"] == "nemo"
    assert contract.lora_request({"text_input": t(b"hi")}) is None
    for tensors, field, text in (({"lora_name": t(b"sql")}, "lora_name", "must all be provided together"),
                                 ({"lora_id": t(3, np.uint64), "lora_path": t(b"/p")}, "lora_id", "together"),
                                 ({**full, "lora_ckpt_source": t(b"s3")}, "lora_ckpt_source", r"one of \('hf', 'nemo'\)"),
                                 ({**full, "lora_id": np.array([1, 2], np.uint64)}, "lora_id", "scalar")):
        with pytest.raises(InvalidRequestError, match=text) as ei:
            contract.lora_request(tensors)
        assert ei.value.field == field
