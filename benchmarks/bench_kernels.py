"""Per-op timings of the C++ CPU kernels against the composed Paddle ops, on SmolLM2-135M shapes.

    .venv/bin/python benchmarks/bench_kernels.py [--threads 2] [--batches 1,8,32] [--ctx 512] [--quick]

Prints the host (CPU model, flags), the read bandwidth of the host measured with a plain AVX2 sum
over 1 GiB, the OpenMP fork/join cost, then per op and batch size: microseconds per call (the
minimum over several repetitions: the least disturbed by other processes on a shared host) and
GB/s, ours (avx2_fma, generic) against the composed op the model calls today. The "w8a8" section
(`--only w8a8`) times wint8's int8 x int8 GEMV (avx512_vnni and avx2_fma paths) against the
weight-only int8 GEMV and the fp32 GEMV at one and two threads, with GB/s of weight bytes and the
fraction of the read bandwidth measured at the same thread count.

GEMV weights are "cold": every call reads a different copy of the weight, and the copies together
exceed twice the L3 cache, so the weights come from DRAM as in a real decode step (a model's
538 MB of weights do not stay in cache between steps). "step" rows run all GEMVs of one SmolLM2
decode step (30 layers x qkv, o, gate_up, down, then the lm head) once: the weight traffic of a
step, the number that bounds decode tokens/s.

The sections are in kernel_gemv_sections.py and kernel_op_sections.py, their shared timer and
shapes in kernel_timing.py (all beside this file).
"""

from __future__ import annotations

import argparse
import os
import sys

import paddle

import paddle_llm_ops.cpu_kernels as ck
from kernel_gemv_sections import (  # noqa: I001 (this folder, run as a script)
    bench_bandwidth, bench_crossover, bench_gemv, bench_gemv_int8, bench_step, bench_w8a8)
from kernel_op_sections import bench_attention, bench_decoder_step, bench_norm, bench_rotary, bench_threading
from kernel_timing import cpu_model, l3_bytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--ctx", type=int, default=512, help="mean context length for attention")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller cold-weight sets and bandwidth buffer")
    ap.add_argument("--only", default="", help="comma list of sections: bw,gemv,int8,w8a8,step,rotary,attn,norm,threads,"
                    "crossover,decoder (default: all but crossover)")
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(a.threads)
    ck.load()
    ck.set_num_threads(a.threads)
    name, flags = cpu_model()
    l3 = l3_bytes()
    budget = (l3 if a.quick else 2 * l3) + (64 << 20)
    print(f"host: {name}; {os.cpu_count()} CPUs; flags {' '.join(flags)}; L3 {l3 >> 20} MiB; threads {a.threads}; "
          f"paddle {paddle.__version__}; kernels {ck.library_path().parent.name}")
    print(f"isas: {', '.join(ck.supported_isas())}; times are the minimum over {a.repeats} repetitions")
    only = set(filter(None, a.only.split(",")))
    want = (lambda s: s in only if only else s != "crossover")
    if want("bw"):
        bench_bandwidth(a.quick)
    if want("gemv"):
        bench_gemv(batches, a.quick, a.repeats, budget)
    if want("int8"):
        bench_gemv_int8(batches, a.quick, a.repeats, budget)
    if want("w8a8"):
        bench_w8a8(batches, a.repeats, budget)
        ck.set_num_threads(a.threads)
        paddle.base.core.set_num_threads(a.threads)
    if want("step"):
        bench_step(batches, a.repeats)
    if want("rotary"):
        bench_rotary(batches, a.repeats)
    if want("attn"):
        bench_attention(batches, a.ctx, a.repeats)
    if want("norm"):
        bench_norm(batches, a.repeats, "avx512f" in flags)
    if want("threads"):
        bench_threading(a.repeats)
    if want("crossover"):
        bench_crossover(a.repeats, budget)
    if want("decoder"):
        bench_decoder_step(batches, a.ctx, a.repeats, "avx512f" in flags)
    return 0


if __name__ == "__main__":
    sys.exit(main())
