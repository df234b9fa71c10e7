"""How the kernels share the CPU: decode tok/s quiet and beside a competing busy process, pool vs OpenMP.

    .venv/bin/python benchmarks/bench_threads.py [--quantization wint8] [--batches 1,8] [--max-tokens 64]
        [--rounds 3] [--threads 2] [--model-dir build/SmolLM2-135M-Instruct]

One engine (bench_engine.py's workload: chat questions, greedy, EOS ignored, batch B submitted at once).
Variants, on the same engine: the kernels' parallel ops on the thread pool (chunks from a shared
counter, the caller waits for chunks, not threads: the default) or as OpenMP regions (one range per
thread and a join barrier: the form before the pool), each with the adaptive kernel-thread tuner on or
off (the default: every decode-stack call on --threads threads). Conditions: quiet, and beside
one competing process at normal priority (a Python busy loop pinned to the last CPU of this
process's affinity mask, started by this command and ended by it). Every (condition, variant) runs
--rounds times, interleaved, so a drifting load hits all alike; the median round is reported, with
its ratio to the same variant quiet. The greedy tokens of every run are compared with the first
quiet pool run (the thread count and the split never change a result).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from pathlib import Path

from comparison.competitor import Competitor  # noqa: I001 (this folder, run as a script)

REPO_ROOT = Path(__file__).resolve().parents[1]
VARIANTS = (("pool", True), ("pool", False), ("openmp", True), ("openmp", False))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(args, run, variants) -> list[dict]:
    """Every (batch, condition, variant) --rounds times, interleaved; one row per triple with the
    median decode tok/s and whether every run's tokens equal the first run's."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    rows = []
    for b in args.batches:
        res = {}
        reference = None
        for _ in range(args.rounds):
            for cond in ("quiet", "competitor"):
                for backend, tuned in variants:
                    if cond == "quiet":
                        r = run(b, backend, tuned)
                    else:
                        with Competitor(cpu):
                            r = run(b, backend, tuned)
                    reference = reference or r["token_ids"]
                    res.setdefault((cond, backend, tuned), []).append(
                        (r["decode_tokens"] / r["decode_s"], r["token_ids"] == reference))
        for (cond, backend, tuned), runs in res.items():
            rows.append({"batch": b, "cond": cond, "backend": backend, "tuner": tuned,
                         "tok_s": statistics.median(t for t, _ in runs), "equal": all(e for _, e in runs)})
        print(f"batch {b} done", file=sys.stderr, flush=True)
    return rows


def print_table(batches, variants, rows) -> None:
    print(f"{'B':>3} {'threads':>8} {'tuner':>6} {'quiet tok/s':>12} {'competitor':>11} {'ratio':>6} {'tokens equal':>13}")
    for b in batches:
        for backend, tuned in variants:
            q, c = (next(r for r in rows if r["batch"] == b and r["backend"] == backend and r["tuner"] == tuned
                         and r["cond"] == cond) for cond in ("quiet", "competitor"))
            print(f"{b:>3} {backend:>8} {'on' if tuned else 'off':>6} {q['tok_s']:>12.1f} {c['tok_s']:>11.1f} "
                  f"{c['tok_s'] / q['tok_s']:>5.2f}x {str(q['equal'] and c['equal']):>13}")


def main(argv=None) -> int:
    be = _load("bench_engine")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--batches", type=be.parse_batches, default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quantization", default="", choices=("", "wint8", "wint4"))
    args = ap.parse_args(argv)
    if args.max_tokens < 2 or args.rounds < 1 or args.threads < 2:
        ap.error("--max-tokens >= 2, --rounds >= 1, --threads >= 2")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error("needs at least 2 CPUs in the affinity mask")

    sys.path[:0] = [str(REPO_ROOT / "backend"), str(REPO_ROOT / "ops"), str(REPO_ROOT / "benchmarks")]
    import kernel_probes as probes
    from paddle_llm_engine import LLM, SamplingParams
    from paddle_llm_engine.tokenizer import encode_prompt, load_tokenizer

    tok = load_tokenizer(str(args.model_dir))
    prompts = [encode_prompt(tok, q, chat=True) for q in be.QUESTIONS[:max(args.batches)]]
    quant = {"quantization": args.quantization} if args.quantization else {}
    llm = LLM(str(args.model_dir), device="cpu", num_threads=args.threads, max_num_seqs=max(args.batches),
              max_num_batched_tokens=max(2048, sum(map(len, prompts))), adaptive_kernel_threads=1, **quant)
    stack = llm.engine.executor.worker.model.decode_stack
    tuner = getattr(stack, "tuner", None) if stack is not None else None
    print(f"decode stack: {'on' if stack is not None else 'off'}, tuner: {'on' if tuner else 'off'}",
          file=sys.stderr)
    variants = [v for v in VARIANTS if tuner is not None or not v[1]]

    def run(b: int, backend: str, tuned: bool) -> dict:
        probes.set_openmp_jobs(backend == "openmp")
        if stack is not None:
            stack.tuner = tuner if tuned else None
        try:
            be.run_ours_once(llm, prompts[:b], 4, SamplingParams)  # warm-up (and the tuner's first probes)
            return be.run_ours_once(llm, prompts[:b], args.max_tokens, SamplingParams)
        finally:
            probes.set_openmp_jobs(False)
            if stack is not None:
                stack.tuner = tuner

    rows = measure(args, run, variants)
    from comparison import measure as cmp

    print(f"host: {cmp.host_info(args.threads).get('cpu', '?')}, {len(cpus)} CPUs; {args.threads} kernel threads; "
          f"{args.quantization or 'fp32'}; {args.max_tokens} tokens; median of {args.rounds} interleaved rounds; "
          f"competitor: a busy loop pinned to CPU {cpus[-1]}")
    print_table(args.batches, variants, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
