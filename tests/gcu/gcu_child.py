"""Child-process side of the stand-in GCU tests: `python gcu_child.py '<json spec>'`.

Everything that loads the stand-in plug-in runs in such a child (tests/gcu/conftest.py `run_child`),
never in the pytest process: once loaded, gcu:0 becomes Paddle's default device for every later
test. The child runs one action, prints one line `GCU_CHILD_RESULT <json>` and leaves with
os._exit (no interpreter teardown: a process with the plug-in loaded once hung in glibc free at exit).

Actions (spec["action"]):
- probe: the plug-in as Paddle sees it (device types, devices, properties, round trips, memory).
- resolve: paddle_llm_engine's device resolution for each [device, device_id] of spec["cases"].
- generate: an engine (spec["engine"] = EngineConfig kwargs) generates greedy tokens for
  spec["prompts"] (token id lists) or spec["text_prompts"] (strings) with spec["max_tokens"]
  each; reports tokens, texts, the worker's platform class, the device, KV blocks, bytes per block, and the
  device memory just before the KV cache was made. Optional: spec["lora_names"] (per prompt: a LoRA
  adapter name or null), spec["logits"] true (also the logits rows behind every token, per prompt).
- start: only builds the engine (start-up errors are the point).
A failure is reported as {"error": {"type", "message"}} (the traceback goes to stderr).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

MARK = "GCU_CHILD_RESULT "


def _plugin_lib():
    """ctypes handle on the stand-in .so (its own accounting), or None."""
    import ctypes
    import glob

    root = os.environ.get("CUSTOM_DEVICE_ROOT")
    libs = sorted(glob.glob(os.path.join(root, "*.so"))) if root else []
    if not libs:
        return None
    lib = ctypes.CDLL(libs[0])  # already loaded by paddle: same handle, same counters
    for name in ("standin_gcu_used_bytes", "standin_gcu_peak_bytes"):
        getattr(lib, name).restype = ctypes.c_size_t
        getattr(lib, name).argtypes = [ctypes.c_int]
    lib.standin_gcu_total_bytes.restype = ctypes.c_size_t
    return lib


def probe(spec: dict) -> dict:
    import numpy as np
    import paddle
    import paddle.base.core as core

    out = {"custom_types": paddle.device.get_all_custom_device_type(),
           "available": paddle.device.get_available_custom_device(),
           "default_device": paddle.device.get_device()}
    if "gcu" not in out["custom_types"]:
        return out
    lib = _plugin_lib()
    out["properties"] = []
    for i in range(len(out["available"])):
        p = core.get_device_properties("gcu", i)
        out["properties"].append({"name": p.name, "total_memory": int(p.total_memory),
                                  "multi_processor_count": int(p.multi_processor_count)})
    try:
        paddle.device.get_device_properties("gcu:0")
        out["public_properties_api"] = "works"
    except Exception as e:  # Paddle 3.3 refuses custom devices here
        out["public_properties_api"] = f"{type(e).__name__}: {e}"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 53)).astype(np.float32)
    before = {d: int(paddle.device.memory_allocated(d)) for d in ("gcu:0", "gcu:1")}
    t0 = paddle.to_tensor(x, place=paddle.CustomPlace("gcu", 0))
    alloc0 = {d: int(paddle.device.memory_allocated(d)) for d in ("gcu:0", "gcu:1")}
    t1 = t0._copy_to(paddle.CustomPlace("gcu", 1), True)  # device to device
    alloc1 = {d: int(paddle.device.memory_allocated(d)) for d in ("gcu:0", "gcu:1")}
    back = t1.cpu().numpy()
    y = paddle.matmul(t0, t0, transpose_y=True)  # runs through the CPU kernel fallback
    out.update({
        "places": [str(t0.place), str(t1.place)],
        "roundtrip_exact": bool(np.array_equal(back, x)) and back.dtype == x.dtype,
        "matmul_close": bool(np.allclose(y.cpu().numpy(), x @ x.T, rtol=1e-5, atol=1e-4)),
        "allocated_before": before, "allocated_after_gcu0": alloc0, "allocated_after_gcu1": alloc1,
        "tensor_bytes": x.nbytes,
        "plugin_used": [int(lib.standin_gcu_used_bytes(i)) for i in range(2)] if lib else None,
        "plugin_total": int(lib.standin_gcu_total_bytes()) if lib else None,
    })
    if spec.get("oom_bytes"):
        try:
            paddle.zeros([int(spec["oom_bytes"]) // 4], dtype="float32")  # on the default device, gcu:0
            out["oom"] = None
        except Exception as e:
            out["oom"] = {"type": type(e).__name__, "message": str(e)[:500]}
    return out


def resolve(spec: dict) -> dict:
    """spec["cases"]: [[device, device_id], ...] -> {"results": [resolved device or {"error": ...}]}."""
    from paddle_llm_engine.platforms import resolve_device

    results = []
    for device, device_id in spec["cases"]:
        try:
            results.append(resolve_device(device, int(device_id)))
        except Exception as e:
            results.append({"error": {"type": type(e).__name__, "message": str(e)}})
    return {"results": results}


def _record_kv_allocation(record: dict):
    """Wrap the worker's KV allocation to read device memory just before it (the weights are loaded
    by then): paddle's memory_reserved and the plug-in's own count."""
    import paddle

    from paddle_llm_engine.worker.worker import Worker

    orig = getattr(Worker, "_allocate_kv_cache", None)
    if orig is None:
        return
    lib = _plugin_lib()

    def wrapped(self, *a, **kw):
        if str(self.device).startswith("gcu"):
            dev_id = int(str(self.device).split(":")[1])
            record["reserved_before_kv"] = int(paddle.device.memory_reserved(self.device))
            record["plugin_used_before_kv"] = int(lib.standin_gcu_used_bytes(dev_id)) if lib else None
        return orig(self, *a, **kw)

    Worker._allocate_kv_cache = wrapped


def _engine(spec: dict, record: dict):
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    _record_kv_allocation(record)
    from paddle_llm_engine import EngineConfig, LLMEngine

    return LLMEngine(EngineConfig(**spec["engine"]))


def _engine_facts(engine, record: dict) -> dict:
    r = engine.executor.worker
    kv = getattr(r, "kv_caches", None)
    kv_dtype = None
    if kv:
        first = kv[0][0] if isinstance(kv[0], (tuple, list)) else kv[0]
        kv_dtype = str(first.dtype).replace("paddle.", "")
    facts = {"device": engine.device, "platform_class": type(r.platform).__name__, "num_kv_blocks": int(r.num_kv_blocks),
             "kv_bytes_per_block": int(r.kv_bytes_per_block()), "kv_dtype": kv_dtype,
             "block_size": int(engine.config.block_size), **record}
    lib = _plugin_lib()
    if lib is not None and str(engine.device).startswith("gcu"):
        dev_id = int(str(engine.device).split(":")[1])
        facts["plugin_used_after_start"] = int(lib.standin_gcu_used_bytes(dev_id))
        facts["plugin_used_other_device"] = int(lib.standin_gcu_used_bytes(1 - dev_id))
    return facts


def start(spec: dict) -> dict:
    record: dict = {}
    engine = _engine(spec, record)
    return _engine_facts(engine, record)


def generate(spec: dict) -> dict:
    from paddle_llm_engine import SamplingParams

    record: dict = {}
    engine = _engine(spec, record)
    prompts = spec.get("prompts")
    if prompts is None:  # text prompts, tokenized as the server tokenizes text_input
        from paddle_llm_engine.tokenizer import encode_prompt

        prompts = [encode_prompt(engine.tokenizer, t) for t in spec["text_prompts"]]
    rids = [f"p{i}" for i in range(len(prompts))]
    lora_names = spec.get("lora_names") or [None] * len(prompts)
    for rid, ids, lora_name in zip(rids, prompts, lora_names):
        engine.add_request(rid, list(ids), SamplingParams(temperature=0.0, ignore_eos=True,
                                                          max_tokens=int(spec["max_tokens"]), lora_name=lora_name))
    tokens = {rid: [] for rid in rids}
    texts = {rid: "" for rid in rids}
    logits = {rid: [] for rid in rids}
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        for o in engine.step(return_logits=bool(spec.get("logits"))):
            tokens[o.request_id] += list(o.token_ids)
            texts[o.request_id] += o.text
            if o.logits is not None:
                logits[o.request_id].append(o.logits.tolist())
    out = {**_engine_facts(engine, record), "tokens": [tokens[r] for r in rids], "texts": [texts[r] for r in rids],
           "steps": steps}
    if spec.get("logits"):
        out["logits"] = [logits[r] for r in rids]
    return out


ACTIONS = {"probe": probe, "resolve": resolve, "start": start, "generate": generate}


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        result = ACTIONS[spec["action"]](spec)
    except BaseException as e:  # reported to the test, which checks the message
        traceback.print_exc()
        result = {"error": {"type": type(e).__name__, "message": str(e)}}
    sys.stderr.flush()
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
