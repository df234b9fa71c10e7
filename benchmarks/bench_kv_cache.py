"""KV cache dtype at long context: decode tok/s and prefill time per kv_cache_dtype, in one command.

    .venv/bin/python benchmarks/bench_kv_cache.py [--contexts 500,2000,4000] [--batches 1,8]
        [--kv-dtypes float32,float16,bfloat16] [--quantization wint8] [--max-tokens 32] [--rounds 2]
        [--threads 2] [--model-dir build/SmolLM2-135M-Instruct]

One offline engine per KV dtype (everything else equal: the C++ CPU kernels, the decode stack), built
once. Workload per (context C, batch B): B prompts of about C tokens each (compare.py's long-context
passages: log records that differ from their first line, so no two prompts share a cached block),
greedy, EOS ignored, submitted at once, prefix caching off (every run pays its whole prefill). Reported: the prefill time of the B prompts (TTFT of the last
one; at B = 1 the TTFT), and decode tok/s over the steps after every prompt's first token, median of
--rounds interleaved rounds (dtype by dtype inside a round, so a drifting host load hits all alike);
each dtype's ratio to float32 in the same round set; and the decode step's bytes: the weights read
once per step (compare.py's estimate for the precision) plus every sequence's K and V (2 x layers x kv_heads x head_dim x elem bytes per token
of context, at the mean context of the decode window), with the bandwidth limit those bytes allow at
the host's measured read bandwidth (a numpy probe, run first) and the fraction of it reached.
Greedy tokens of each dtype are compared with float32's: how many of the B sequences agree on all.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ELEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse_list(text: str, conv=int) -> list:
    out = [conv(x) for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError("an empty list")
    return out


def kv_bytes_per_token(cfg, elem: int) -> int:
    """K and V of every layer for one token of context, in bytes."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem


def measure(args, engines: dict, prompts: dict, be, SamplingParams, level_done) -> None:
    """--rounds rounds per (context, batch) level, the dtypes interleaved inside each round, after one
    short warm-up run per engine and level; level_done(context, batch, {kv dtype: [run_ours_once
    results]}) after each level (rows are printed as they are measured)."""
    for c in args.contexts:
        for b in args.batches:
            ps = prompts[c][:b]
            for llm in engines.values():
                be.run_ours_once(llm, ps, 4, SamplingParams)
            runs = {}
            for _ in range(args.rounds):
                for kv, llm in engines.items():
                    runs.setdefault(kv, []).append(be.run_ours_once(llm, ps, args.max_tokens, SamplingParams))
            level_done(c, b, runs)


def print_header(args, bw: dict, host: dict, wbytes: int) -> None:
    print(f"host: {host.get('cpu', '?')}; {args.threads} threads; read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s "
          f"(numpy probe); {args.quantization or 'fp32'} weights ({wbytes / 1e6:.0f} MB read per step); "
          f"{args.max_tokens} tokens; median of {args.rounds} interleaved rounds; prefix caching off")
    print(f"{'ctx':>5} {'B':>3} {'kv':>9} {'prompt':>7} {'prefill s':>10} {'decode tok/s':>13} {'x fp32':>7} "
          f"{'MB/step':>8} {'limit tok/s':>12} {'of limit':>9} {'same tokens':>12}", flush=True)


def print_level(args, c: int, b: int, runs: dict, bw: dict, wbytes: int, cfg) -> None:
    """Per dtype: prefill s, decode tok/s (median), ratio to float32, the step's bytes, the bandwidth
    limit they allow, the fraction reached, and the sequences whose tokens equal float32's."""
    ref = runs["float32"]
    ref_rate = statistics.median(r["decode_tokens"] / r["decode_s"] for r in ref)
    for kv in args.kv_dtypes:
        rate = statistics.median(r["decode_tokens"] / r["decode_s"] for r in runs[kv])
        prefill = statistics.median(r["prefill_s"] for r in runs[kv])
        first = runs[kv][0]
        mean_ctx = first["prompt_tokens"] / b + args.max_tokens / 2
        step_bytes = wbytes + b * mean_ctx * kv_bytes_per_token(cfg, ELEM_BYTES[kv])
        limit = b * bw["bytes_per_s"] / step_bytes
        same = sum(x == y for x, y in zip(first["token_ids"], ref[0]["token_ids"]))
        print(f"{c:>5} {b:>3} {kv:>9} {first['prompt_tokens'] // b:>7} {prefill:>10.3f} {rate:>13.1f} "
              f"{rate / ref_rate:>6.2f}x {step_bytes / 1e6:>8.0f} {limit:>12.1f} {rate / limit:>8.0%} "
              f"{same:>6} of {b}", flush=True)


def main(argv=None) -> int:
    be = _load("bench_engine")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--contexts", type=parse_list, default=[500, 2000, 4000])
    ap.add_argument("--batches", type=parse_list, default=[1, 8])
    ap.add_argument("--kv-dtypes", type=lambda s: parse_list(s, str), default=["float32", "float16", "bfloat16"])
    ap.add_argument("--quantization", default="wint8", choices=("", "wint8", "wint4"))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.max_tokens < 4 or args.rounds < 1 or args.kv_dtypes[0] != "float32":
        ap.error("--max-tokens >= 4, --rounds >= 1, and --kv-dtypes must start with float32 (the reference)")
    bad = [d for d in args.kv_dtypes if d not in ELEM_BYTES]
    if bad:
        ap.error(f"--kv-dtypes: unknown {bad} (float32, float16, bfloat16)")

    sys.path[:0] = [str(REPO_ROOT / "backend"), str(REPO_ROOT / "ops"), str(REPO_ROOT / "benchmarks")]
    from comparison import measure as cmp
    from comparison.workers import with_context
    from paddle_llm_engine import LLM, SamplingParams
    from paddle_llm_engine.tokenizer import encode_prompt, load_tokenizer

    bw = cmp.measure_bandwidth(args.threads)
    tok = load_tokenizer(str(args.model_dir))
    nb, longest = max(args.batches), max(args.contexts)
    prompts = {c: [encode_prompt(tok, with_context(tok, q, i, c), chat=True) for i, q in enumerate(be.QUESTIONS[:nb])]
               for c in args.contexts}
    max_len = longest + args.max_tokens + 64
    blocks = nb * (-(-max_len // 64)) + 8
    engines = {}
    for kv in args.kv_dtypes:
        quant = {"quantization": args.quantization} if args.quantization else {}
        engines[kv] = LLM(str(args.model_dir), device="cpu", num_threads=args.threads, max_num_seqs=nb,
                          max_model_len=max_len, max_num_batched_tokens=max(2048, longest + 64), block_size=64,
                          num_kv_blocks=blocks, kv_cache_dtype=kv, enable_prefix_caching=False, **quant)
        plan = engines[kv].engine.executor.plan
        print(f"engine kv_cache_dtype {plan.kv_cache_dtype}: kernels {plan.cpu_isa}, decode stack "
              f"{'on' if engines[kv].engine.executor.worker.model.decode_stack is not None else 'off'}",
              file=sys.stderr)
    cfg = engines["float32"].engine.executor.worker.model_config
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    wbytes = {"": lambda: 4 * be.parameter_count(args.model_dir, tied), "wint8": lambda: cmp.wint8_bytes_estimate(
        args.model_dir, tied), "wint4": lambda: cmp.wint4_bytes_estimate(args.model_dir, tied)}[args.quantization]()

    print_header(args, bw, cmp.host_info(args.threads), wbytes)
    measure(args, engines, prompts, be, SamplingParams,
            lambda c, b, runs: print_level(args, c, b, runs, bw, wbytes, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
