"""int8 x int8 at batch: the AVX-512 VNNI GEMM against the GEMV tiles it replaced, per op and in the engine.

    .venv/bin/python benchmarks/bench_int8_batch.py [--batches 8,16,32,64] [--max-tokens 64] [--rounds 3]
        [--threads 2] [--model-dir build/SmolLM2-135M-Instruct] [--skip-engine]

Part 1, the op (cpu_kernels.gemv_w8a8, groups of 32, SmolLM2's shapes): best of 5 calls each of the
GEMM (csrc/gemm_w8a8.cc), the GEMV tiles (csrc/gemv_w8a8_tiles.cc, the GEMM switched off with
set_w8a8_gemm_min_rows) and the prefill path of the other isas (the weight dequantized to fp32, then
paddle.matmul), in ms and multiply-adds per second, from 8 rows to 2,000.
Part 2, the engine (wint8, bench_engine.py's workload: chat questions, greedy, EOS ignored, B
sequences submitted at once): decode tok/s with the GEMM from W8A8_GEMM_MIN_ROWS rows (the default)
and with the tiles at every batch, --rounds interleaved rounds, the median reported; the greedy
tokens of both must be equal (the GEMM returns the exact path's values; the tiles' lane sums differ
from them within fp32 rounding, so a token may differ in principle: reported, not asserted).
Needs a CPU with AVX-512 VNNI (refused otherwise).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHAPES = (("qkv", 960, 576), ("gate_up", 3072, 576), ("down", 576, 1536))  # SmolLM2-135M: (name, N, K)
OFF = 1 << 40  # set_w8a8_gemm_min_rows: more rows than any call has = the GEMV tiles


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _best(fn, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def ops_table(ck, paddle, np) -> None:
    rng = np.random.default_rng(0)
    print(f"{'op':>8} {'rows':>5} | {'GEMM ms':>8} {'GMAC/s':>7} | {'tiles ms':>8} {'x':>6} | {'dequant+matmul ms':>17} {'x':>6}")
    for name, n, k in SHAPES:
        q, s = ck.quantize_int8_numpy(rng.standard_normal((n, k)).astype(np.float32))
        q, s = paddle.to_tensor(q), paddle.to_tensor(s)
        for b in (8, 16, 32, 64, 128, 512, 2000):
            x = paddle.to_tensor(rng.standard_normal((b, k)).astype(np.float32))
            ck.set_w8a8_gemm_min_rows(1)
            gemm = _best(lambda: ck.gemv_w8a8(x, q, s, None, "avx512_vnni", 32))
            ck.set_w8a8_gemm_min_rows(OFF)
            tiles = _best(lambda: ck.gemv_w8a8(x, q, s, None, "avx512_vnni", 32))
            ck.set_w8a8_gemm_min_rows(0)
            deq = _best(lambda: paddle.matmul(x, ck.dequantize_int8(q, s), transpose_y=True))
            print(f"{name:>8} {b:>5} | {gemm * 1e3:>8.3f} {b * n * k / gemm / 1e9:>7.1f} | {tiles * 1e3:>8.3f} "
                  f"{tiles / gemm:>5.2f}x | {deq * 1e3:>17.3f} {deq / gemm:>5.2f}x", flush=True)


def engine_table(args, ck) -> None:
    be = _load("bench_engine")
    from paddle_llm_engine import LLM, SamplingParams
    from paddle_llm_engine.tokenizer import encode_prompt, load_tokenizer

    tok = load_tokenizer(str(args.model_dir))
    prompts = [encode_prompt(tok, be.QUESTIONS[i % len(be.QUESTIONS)], chat=True) for i in range(max(args.batches))]
    llm = LLM(str(args.model_dir), device="cpu", num_threads=args.threads, max_num_seqs=max(args.batches),
              max_num_batched_tokens=max(2048, sum(map(len, prompts))), quantization="wint8")
    res: dict = {}
    for _ in range(args.rounds):
        for b in args.batches:
            for variant, rows in (("gemm", 0), ("tiles", OFF)):
                ck.set_w8a8_gemm_min_rows(rows)
                try:
                    be.run_ours_once(llm, prompts[:b], 4, SamplingParams)
                    r = be.run_ours_once(llm, prompts[:b], args.max_tokens, SamplingParams)
                finally:
                    ck.set_w8a8_gemm_min_rows(0)
                res.setdefault((b, variant), []).append((r["decode_tokens"] / r["decode_s"], r["token_ids"]))
    print(f"\n{'B':>3} | {'GEMM tok/s':>10} | {'tiles tok/s':>11} | {'x':>6} | tokens equal")
    for b in args.batches:
        g, t = res[(b, "gemm")], res[(b, "tiles")]
        gm, tm = statistics.median(v for v, _ in g), statistics.median(v for v, _ in t)
        equal = all(ids == t[0][1] for _, ids in g + t)
        print(f"{b:>3} | {gm:>10.1f} | {tm:>11.1f} | {gm / tm:>5.2f}x | {equal}")


def main(argv=None) -> int:
    be = _load("bench_engine")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--batches", type=be.parse_batches, default=[8, 16, 32, 64])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-engine", action="store_true", help="the op table only")
    args = ap.parse_args(argv)
    if args.max_tokens < 2 or args.rounds < 1 or args.threads < 1:
        ap.error("--max-tokens >= 2, --rounds >= 1, --threads >= 1")
    sys.path[:0] = [str(REPO_ROOT / "backend"), str(REPO_ROOT / "ops"), str(REPO_ROOT / "benchmarks")]
    import numpy as np
    import paddle

    import paddle_llm_ops.cpu_kernels as ck
    from comparison import measure as cmp

    paddle.set_device("cpu")
    if not ck.cpu_supports_avx512_vnni():
        ap.error("this CPU has no AVX-512 VNNI: the int8 GEMM does not run here")
    ck.set_num_threads(args.threads)
    print(f"host: {cmp.host_info(args.threads).get('cpu', '?')}; {args.threads} kernel threads; groups of 32")
    ops_table(ck, paddle, np)
    if not args.skip_engine:
        engine_table(args, ck)
    return 0


if __name__ == "__main__":
    sys.exit(main())
