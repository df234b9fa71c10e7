"""Child-process side of tests/gcu/test_gcu_kernels.py: `python gcu_kernels_child.py '<json spec>'`.

Runs one engine (spec["engine"]: EngineConfig kwargs) over a request schedule and prints one line
`GCU_CHILD_RESULT <json>` (the protocol of gcu_child.py), then leaves with os._exit.

spec["requests"]: [{"id", "prompt": [ids], "max_tokens", "n" (1), "at_step" (0)}]: each request is
added when the engine has run `at_step` steps (so later ones join while earlier ones decode: mixed
steps). Greedy sampling (temperature 0, ignore_eos).

Reported: tokens {request id: [[tokens of sequence 0], ...]}, the plan's decisions and kernels, the
OpSet's names / kv_layout / attention_metadata, the first KV cache's shape, preemptions, copies on
write, prefix-cache hit tokens; and for the first step that mixes decodes with prompt chunks (one
of which continues a cached prefix, where the schedule makes one) the call-log lines of that step
(env STANDIN_GCU_CALL_LOG: the stand-in's one line per custom-op call) with the step's make-up and
the number of composed KV gathers (kv_cache.gather_kv) and softmax calls made during it.

spec["collectives"] = {"rank", "size", "port", "exit_early"} instead runs one rank of
paddle.distributed over the stand-in's xccl_* callbacks (the environment GcuPlatform.collective_env
gives a rank on gcu:<rank>): all_reduce (each dtype with SUM, float32 with MAX / MIN / PROD),
broadcast, reduce, all_gather and reduce_scatter, some larger than the stand-in's 1 MiB slot (so
they run in chunks), each compared with numpy on the ranks' seeded inputs; reported as
{"checks": {name: max |got - want|}}. With exit_early, the last rank then goes silent and leaves
(os._exit) while rank 0 tries more all_reduces: see _failures.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

MARK = "GCU_CHILD_RESULT "


class StepRecorder:
    """Wraps Worker.execute: per step, its make-up, the call-log lines it produced, and how often the
    composed attention's KV gather and softmax ran while it did."""

    def __init__(self):
        self.steps: list[dict] = []
        self.log_path = os.environ.get("STANDIN_GCU_CALL_LOG", "")
        self.gathers = 0
        self.softmaxes = 0

    def install(self):
        import paddle.nn.functional as F

        import paddle_llm_ops.kv_cache as kv
        import paddle_llm_ops.paged_attention as pa
        from paddle_llm_engine.worker.worker import Worker

        rec = self
        gather, softmax, execute = pa.gather_kv, F.softmax, Worker.execute

        def counted_gather(*a, **kw):
            rec.gathers += 1
            return gather(*a, **kw)

        def counted_softmax(*a, **kw):
            rec.softmaxes += 1
            return softmax(*a, **kw)

        pa.gather_kv = kv.gather_kv = counted_gather
        F.softmax = counted_softmax

        def recorded(worker, step):
            before = self._log_size()
            g0, s0 = rec.gathers, rec.softmaxes
            out = execute(worker, step)
            rec.steps.append({
                "decodes": sum(1 for s in step.seqs if s.num_tokens == 1),
                "chunks": [[s.start, s.num_tokens] for s in step.seqs if s.num_tokens > 1],
                "log": self._log_since(before), "gathers": rec.gathers - g0, "softmaxes": rec.softmaxes - s0})
            return out

        Worker.execute = recorded

    def _log_size(self) -> int:
        return os.path.getsize(self.log_path) if self.log_path and os.path.exists(self.log_path) else 0

    def _log_since(self, offset: int) -> list[str]:
        if not self.log_path or not os.path.exists(self.log_path):
            return []
        with open(self.log_path) as f:
            f.seek(offset)
            return f.read().splitlines()

    def mixed_step(self) -> dict | None:
        """The first step with decodes and prompt chunks, preferring one whose chunk continues cached keys."""
        mixed = [s for s in self.steps if s["decodes"] and s["chunks"]]
        later = [s for s in mixed if any(start > 0 for start, _ in s["chunks"])]
        return (later or mixed or [None])[0]


def _run(engine, requests: list[dict]) -> tuple[dict, int]:
    from paddle_llm_engine import SamplingParams

    pending = sorted(requests, key=lambda r: r.get("at_step", 0))
    tokens: dict[str, dict[int, list[int]]] = {r["id"]: {} for r in requests}
    steps = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].get("at_step", 0) <= steps:
            r = pending.pop(0)
            sp = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=int(r["max_tokens"]), n=int(r.get("n", 1)))
            engine.add_request(r["id"], list(r["prompt"]), sp)
        for o in engine.step():
            if o.error:
                raise RuntimeError(f"request {o.request_id} failed: {o.error}")
            tokens[o.request_id].setdefault(o.sequence_index, []).extend(o.token_ids)
        steps += 1
    return {rid: [seqs[i] for i in sorted(seqs)] for rid, seqs in tokens.items()}, steps


def scenario(spec: dict) -> dict:
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    rec = StepRecorder()
    rec.install()
    from paddle_llm_engine import EngineConfig, LLMEngine

    engine = LLMEngine(EngineConfig(**spec["engine"]))
    tokens, steps = _run(engine, spec["requests"])
    worker = getattr(engine.executor, "worker", None)
    out = {"device": engine.device, "tokens": tokens, "steps": steps,
           "preemptions": int(engine.scheduler.num_preemptions),
           "cow_copies": int(engine.block_manager.num_cow_copies),
           "prefix_hit_tokens": int(engine.block_manager.prefix_hit_tokens)}
    if worker is not None:
        ops = worker.ops
        out.update({"decisions": worker.plan.decisions, "kernels": worker.plan.kernels, "dtype": worker.plan.dtype,
                    "names": dict(ops.names), "kv_layout": ops.kv_layout, "attention_metadata": ops.attention_metadata,
                    "kv_shape": list(worker.kv_caches[0][0].shape), "num_layers": len(worker.kv_caches),
                    "mixed_step": rec.mixed_step()})
    return out


BIG = 300_001  # float32 elements: more than the stand-in's 1 MiB slot per rank, not a multiple of it
DTYPES = ("float32", "float64", "bfloat16", "float16", "int64", "int32", "int8")


def _inputs(rank: int, n: int, dtype: str, salt: int = 0):
    """Rank `rank`'s seeded input as numpy: normal floats for float32 / float64, else integers in
    [-8, 8] (exact in every dtype, as are their sums and products over two ranks)."""
    import numpy as np

    rng = np.random.default_rng(1000 * salt + rank)
    if dtype in ("float32", "float64"):
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-8, 9, size=n).astype("float32" if dtype in ("bfloat16", "float16") else dtype)


def _tensor(a, dtype: str):
    import paddle

    return paddle.to_tensor(a).astype(dtype)


def _diff(got, want) -> float:
    import numpy as np

    return float(np.max(np.abs(got.astype("float64").numpy() - np.asarray(want, dtype="float64"))))


def _collective_checks(rank: int, size: int) -> dict:
    """{name: max |got - want|} of each collective on this rank (see the module docstring)."""
    import numpy as np
    import paddle.distributed as dist

    ops = {"max": (dist.ReduceOp.MAX, np.max),
           "min": (dist.ReduceOp.MIN, np.min), "prod": (dist.ReduceOp.PROD, np.prod)}
    # (no AVG: paddle.distributed's Python side asks core.nccl_version() for it, absent off CUDA)
    out = {}
    for dtype in DTYPES:
        n = BIG if dtype == "float32" else 1000
        x = _tensor(_inputs(rank, n, dtype), dtype)
        dist.all_reduce(x)
        want = sum(_inputs(r, n, dtype).astype("float64") for r in range(size))  # exact for two ranks
        out[f"all_reduce sum {dtype}"] = _diff(x, want.astype("float32") if dtype == "float32" else want)
    for name, (op, ref) in ops.items():
        x = _tensor(_inputs(rank, 1000, "float32", 1), "float32")
        dist.all_reduce(x, op=op)
        want = ref(np.stack([_inputs(r, 1000, "float32", 1) for r in range(size)]), axis=0)
        out[f"all_reduce {name} float32"] = _diff(x, want.astype("float32"))
    x = _tensor(_inputs(rank, BIG, "float32", 2), "float32")
    dist.broadcast(x, src=size - 1)
    out["broadcast float32"] = _diff(x, _inputs(size - 1, BIG, "float32", 2))
    x = _tensor(_inputs(rank, 1000, "int64", 3), "int64")
    dist.reduce(x, dst=0)
    if rank == 0:
        out["reduce sum int64 (dst 0)"] = _diff(x, sum(_inputs(r, 1000, "int64", 3) for r in range(size)))
    got = []
    dist.all_gather(got, _tensor(_inputs(rank, BIG, "float32", 4), "float32"))
    out["all_gather float32"] = max(_diff(g, _inputs(r, BIG, "float32", 4)) for r, g in enumerate(got))
    parts = [_tensor(_inputs(rank, BIG, "float32", 5 + d), "float32") for d in range(size)]
    x = _tensor(np.zeros(BIG, "float32"), "float32")
    dist.reduce_scatter(x, parts)
    want = sum(_inputs(r, BIG, "float32", 5 + rank).astype("float64") for r in range(size)).astype("float32")
    out["reduce_scatter sum float32"] = _diff(x, want)
    return out


def collectives(spec: dict) -> dict:
    """One rank of spec["collectives"] (see the module docstring)."""
    import time

    c = spec["collectives"]
    rank, size = int(c["rank"]), int(c["size"])
    from paddle_llm_engine.platforms import Device, platform_for

    device = Device.parse(f"gcu:{rank}")
    port = int(c["port"])
    os.environ.update(PADDLE_TRAINER_ID=str(rank), PADDLE_TRAINERS_NUM=str(size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{port + rank}",
                      PADDLE_TRAINER_ENDPOINTS=",".join(f"127.0.0.1:{port + r}" for r in range(size)),
                      **platform_for(device).collective_env(device))
    import paddle
    import paddle.distributed as dist

    paddle.set_device(str(device))
    dist.init_parallel_env()
    out = {"checks": _collective_checks(rank, size)}
    if c.get("exit_early"):
        out.update(_failures(rank, size))
    return out


SILENT_S = 6.0  # how long the last rank stays alive but silent before it leaves


def _failing_all_reduce(group, timeout_s: str) -> list:
    """[what one all_reduce of rank 0 raised (or "no error"), seconds it took], its wait bounded
    by STANDIN_GCU_XCCL_TIMEOUT_S = timeout_s (the plug-in reads it at every wait)."""
    import time

    import paddle
    import paddle.distributed as dist

    os.environ["STANDIN_GCU_XCCL_TIMEOUT_S"] = timeout_s
    t0 = time.monotonic()
    try:
        dist.all_reduce(paddle.ones([4]), group=group)
        return ["no error", time.monotonic() - t0]
    except Exception as e:  # what Paddle raises for the plug-in's failure
        return [f"{type(e).__name__}: {e}", time.monotonic() - t0]


def _failures(rank: int, size: int) -> dict:
    """A second communicator (new_group) is set up; then the last rank stays silent for SILENT_S
    and leaves (os._exit). Rank 0: an all_reduce on the new group with a 1 s timeout
    ("silent_peer"), then two on the world group with 60 s ("dead_peer": the peer's exit is
    noticed, then the communicator is failed at once)."""
    import time

    import paddle
    import paddle.distributed as dist

    group = dist.new_group(list(range(size)))
    dist.all_reduce(paddle.ones([4]), group=group)  # its communicator is up on every rank
    if rank == size - 1:
        time.sleep(SILENT_S)
        os._exit(0)
    if rank != 0:
        return {}
    silent = _failing_all_reduce(group, "1")
    return {"silent_peer": silent, "dead_peer": [_failing_all_reduce(None, "60") for _ in range(2)]}


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        result = collectives(spec) if "collectives" in spec else scenario(spec)
    except BaseException as e:  # reported to the test, which shows it with the child's stderr
        traceback.print_exc()
        result = {"error": {"type": type(e).__name__, "message": str(e)}}
    sys.stderr.flush()
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
