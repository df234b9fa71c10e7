"""LoRA cost per token: decode tok/s and prefill time with 0, 1 and 3 adapters in the batch, in one
command.

    .venv/bin/python benchmarks/bench_lora.py [--batches 1,8] [--rank 16] [--quantization ""]
        [--max-tokens 64] [--prompt-tokens 128] [--rounds 3] [--model-dir build/SmolLM2-135M-Instruct]

One offline engine with enable_lora and three random adapters of rank --rank on every projection
(q/k/v/o/gate/up/down of every layer; tests/support/lora_adapters.py), built once, and one engine
without LoRA (the base, whose decode steps may run on the CPU decode stack). Workload per batch B:
B prompts of --prompt-tokens tokens (distinct, so no prefix is shared), greedy, EOS ignored,
submitted at once. Cases: "no LoRA engine", "0 adapters" (the LoRA engine, every row the base),
"1 adapter" (every row the same adapter), "3 adapters" (rows spread over three adapters; at B = 1
the single row takes one adapter per round in turn). Reported per case: prefill time of the B
prompts, decode tok/s over the steps after every first token (median of --rounds interleaved
rounds: case by case inside a round, so host drift hits all alike), and the ratio to the no-LoRA
engine measured in the same rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default=str(REPO_ROOT / "build" / "SmolLM2-135M-Instruct"))
    p.add_argument("--batches", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--quantization", default="")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    be = _load(REPO_ROOT / "benchmarks" / "bench_engine.py", "bench_engine")
    la = _load(REPO_ROOT / "tests" / "support" / "lora_adapters.py", "lora_adapters")
    from paddle_llm_engine import SamplingParams
    from paddle_llm_engine.llm import LLM

    tmp = Path(tempfile.mkdtemp(prefix="bench_lora_"))
    names = ["a", "b", "c"]
    for i, n in enumerate(names):
        la.make_adapter(args.model_dir, tmp / n, seed=i + 1, r=args.rank, alpha=2.0 * args.rank)
    common = dict(max_model_len=args.prompt_tokens + args.max_tokens + 64, enable_prefix_caching=0,
                  quantization=args.quantization)
    lora_llm = LLM(args.model_dir, enable_lora=1, max_loras=3, max_lora_rank=max(16, args.rank),
                   lora_modules=",".join(f"{n}={tmp / n}" for n in names), **common)
    base_llm = LLM(args.model_dir, **common)
    info = lora_llm.engine.info()
    print(f"# bench_lora: {Path(args.model_dir).name}, rank {args.rank} on q/k/v/o/gate/up/down of every layer, "
          f"{info['kernels']}, quantization {info['quantization']}, {args.prompt_tokens}-token prompts, "
          f"{args.max_tokens} tokens, median of {args.rounds} rounds")
    vocab = lora_llm.engine.model_config.vocab_size
    print(f"{'batch':>5} {'case':<16} {'prefill s':>9} {'decode tok/s':>12} {'x no-LoRA':>9}")
    for b in args.batches:
        prompts = [[1] + [(97 + 31 * i + 7 * j) % (vocab - 2) + 1 for j in range(args.prompt_tokens - 1)]
                   for i in range(b)]
        cases = {"no LoRA engine": (base_llm, lambda r: [None] * b),
                 "0 adapters": (lora_llm, lambda r: [None] * b),
                 "1 adapter": (lora_llm, lambda r: ["a"] * b),
                 "3 adapters": (lora_llm, lambda r: [names[(i + r) % 3] for i in range(b)])}
        runs: dict[str, list[dict]] = {c: [] for c in cases}
        for r in range(-1, args.rounds):  # round -1: warm-up, not kept
            for case, (llm, lora_names) in cases.items():
                chosen = lora_names(r)

                def params(**kw):
                    return [SamplingParams(**kw, lora_name=n) for n in chosen]

                res = be.run_ours_once(llm, prompts, args.max_tokens, params)
                if r >= 0:
                    runs[case].append(res)
        base_rate = statistics.median(x["decode_tokens"] / x["decode_s"] for x in runs["no LoRA engine"])
        for case, rs in runs.items():
            rate = statistics.median(x["decode_tokens"] / x["decode_s"] for x in rs)
            prefill = statistics.median(x["prefill_s"] for x in rs)
            print(f"{b:>5} {case:<16} {prefill:>9.3f} {rate:>12.1f} {rate / base_rate:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
