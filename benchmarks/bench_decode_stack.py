"""The decode stack against the op-by-op path, in one process, on one engine, runs interleaved:

    .venv/bin/python benchmarks/bench_decode_stack.py [--quantization wint8] [--batches 1,8,32]
        [--max-tokens 64] [--rounds 3] [--threads 2] [--model-dir build/SmolLM2-135M-Instruct]

Workload: bench_engine.py's (chat-formatted questions, greedy, max_tokens per request with EOS
ignored, batch B = the first B questions submitted at once). For each batch the two paths run
alternately `--rounds` times each (on, off, on, off, ...), so a load that drifts during the command
hits both alike; the best round of each is reported: decode tokens/s, step ms and the ratio
stack / op-by-op. The greedy tokens of the two paths are compared: decode steps are bit-identical,
but a batch whose prompts fit the stack's prefill bound (<= 64 prompt rows: batch 1 here) is
prefilled on the stack, within 1e-4 of the batched prefill, so a near-tie may later go either way. The read bandwidth is measured in the same command
(benchmarks/compare.py's probe) and the stack's batch-1 step is given as a share of the bandwidth
limit of the weights actually read (fp32 or int8 bytes + scales).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from comparison import measure as cmp  # noqa: I001 (this folder, run as a script)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    be = _load("bench_engine")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--batches", type=be.parse_batches, default=[1, 8, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quantization", default="", choices=("", "wint8", "wint4"))
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.max_tokens < 2 or args.rounds < 1 or max(args.batches) > len(be.QUESTIONS):
        ap.error(f"--max-tokens >= 2, --rounds >= 1, batches <= {len(be.QUESTIONS)}")

    from paddle_llm_engine import LLM, SamplingParams
    from paddle_llm_engine.tokenizer import encode_prompt, load_tokenizer

    bw = cmp.measure_bandwidth(args.threads)
    tok = load_tokenizer(str(args.model_dir))
    prompts = [encode_prompt(tok, q, chat=True) for q in be.QUESTIONS[:max(args.batches)]]
    quant = {"quantization": args.quantization} if args.quantization else {}
    llm = LLM(str(args.model_dir), device="cpu", num_threads=args.threads, max_num_seqs=max(args.batches),
              max_num_batched_tokens=max(2048, sum(map(len, prompts))), **quant)
    model = llm.engine.executor.worker.model
    stack = model.decode_stack
    print(f"decode stack: {model.decode_stack_info}", file=sys.stderr)
    if stack is None:
        print("error: the engine has no decode stack here", file=sys.stderr)
        return 1
    cfg = json.loads((args.model_dir / "config.json").read_text())
    tied = bool(cfg.get("tie_word_embeddings", False))
    weight_bytes = (cmp.wint8_bytes_estimate(args.model_dir, tied) if args.quantization == "wint8"
                    else be.parameter_count(args.model_dir, tied) * 4)
    results = []
    for b in args.batches:
        batch = prompts[:b]
        rounds = {"stack": [], "op-by-op": []}
        for _ in range(args.rounds):
            for name, s in (("stack", stack), ("op-by-op", None)):
                model.decode_stack = s
                be.run_ours_once(llm, batch, 4, SamplingParams)  # warm-up
                rounds[name].append(be.run_ours_once(llm, batch, args.max_tokens, SamplingParams))
        model.decode_stack = stack
        row = {"batch": b}
        for name, runs in rounds.items():
            best = min(runs, key=lambda r: r["decode_s"] / max(r["decode_tokens"], 1))
            row[name] = {"decode_tok_s": best["decode_tokens"] / best["decode_s"],
                         "step_ms": 1e3 * best["decode_s"] / best["decode_steps"]}
        row["ratio"] = row["stack"]["decode_tok_s"] / row["op-by-op"]["decode_tok_s"]
        row["tokens_identical"] = all(a["token_ids"] == o["token_ids"]
                                      for a, o in zip(rounds["stack"], rounds["op-by-op"]))
        results.append(row)
        print(f"batch {b}: stack {row['stack']['decode_tok_s']:.1f} tok/s, op-by-op "
              f"{row['op-by-op']['decode_tok_s']:.1f} tok/s", file=sys.stderr, flush=True)

    print_results(args, bw, weight_bytes, results)
    if args.json:
        args.json.write_text(json.dumps({"bandwidth": bw, "weight_bytes": weight_bytes, "results": results}, indent=1))
    return 0


def print_results(args, bw: dict, weight_bytes: float, results: list[dict]) -> None:
    """The table (decode tok/s, step ms, stack / op-by-op) and batch 1's share of the bandwidth limit."""
    limit = bw["bytes_per_s"] / weight_bytes
    print(f"host: {cmp.host_info(args.threads).get('cpu', '?')}; read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s "
          f"(this command); weights read per step {weight_bytes / 1e6:.0f} MB ({args.quantization or 'fp32'}) "
          f"-> limit {limit:.1f} tok/s per sequence")
    print(f"{'B':>3} {'stack tok/s':>12} {'op-by-op tok/s':>15} {'stack/op':>9} {'stack ms':>9} {'op ms':>7} "
          f"{'tokens equal':>12}")
    for r in results:
        print(f"{r['batch']:>3} {r['stack']['decode_tok_s']:>12.1f} {r['op-by-op']['decode_tok_s']:>15.1f} "
              f"{r['ratio']:>8.2f}x {r['stack']['step_ms']:>9.2f} {r['op-by-op']['step_ms']:>7.2f} "
              f"{str(r['tokens_identical']):>12}")
    one = next((r for r in results if r["batch"] == 1), None)
    if one:
        print(f"batch 1: stack at {100 * one['stack']['decode_tok_s'] / limit:.0f}% of the bandwidth limit, "
              f"op-by-op at {100 * one['op-by-op']['decode_tok_s'] / limit:.0f}%")


if __name__ == "__main__":
    sys.exit(main())
