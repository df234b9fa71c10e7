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


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        result = scenario(spec)
    except BaseException as e:  # reported to the test, which shows it with the child's stderr
        traceback.print_exc()
        result = {"error": {"type": type(e).__name__, "message": str(e)}}
    sys.stderr.flush()
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
