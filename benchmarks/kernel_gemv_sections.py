"""The GEMV sections of benchmarks/bench_kernels.py (microseconds per call, GB/s of weight bytes, cold
weights): the read bandwidth (bw), fp32 (gemv) and weight-only int8 (int8) GEMVs against the composed
matmul, wint8's int8 x int8 GEMV (w8a8), all GEMVs of one decode step (step) and the batch at which
paddle.matmul overtakes our GEMV (crossover)."""

from __future__ import annotations

import numpy as np
import paddle

import kernel_probes as probes  # noqa: I001 (this folder, run as a script)
import paddle_llm_ops.cpu_kernels as ck
from kernel_timing import GEMVS, HIDDEN, INTER, LAYERS, VOCAB, row, timed, timeit


def bench_bandwidth(quick: bool) -> float:
    buf = np.ones((64 if quick else 256) << 20, np.float32)
    out = 0.0
    for threads in sorted({1, ck.get_num_threads()}):
        best = min(timed(lambda: probes.read_bandwidth_probe(buf, threads)) for _ in range(5))
        gbs = buf.nbytes / best / 1e9
        print(f"read bandwidth, {threads} thread(s), AVX2 sum over {buf.nbytes >> 20} MiB: {gbs:.1f} GB/s")
        out = max(out, gbs)
    return out


def bench_gemv(batches, quick, repeats, budget):
    print("\n== GEMV fp32 (y = x W^T; ours on W [N, K]; composed = paddle.matmul(x, W_kn) as the model holds it "
          "today, mm_T = paddle.matmul(x, W_nk, transpose_y=True)); cold weights")
    rng = np.random.default_rng(0)
    for name, n, k in GEMVS:
        nbytes = n * k * 4
        copies = max(2, -(-budget // nbytes))
        w_nk = [paddle.to_tensor(rng.standard_normal((n, k), dtype=np.float32)) for _ in range(copies)]
        w_kn = [paddle.to_tensor(np.ascontiguousarray(w.numpy().T)) for w in w_nk]
        for b in batches:
            x = paddle.to_tensor(rng.standard_normal((b, k), dtype=np.float32))
            reps = max(copies, 10)
            cols = [
                ("avx2", timeit(lambda i: ck.gemv(x, w_nk[i % copies], isa="avx2_fma"), reps, repeats), nbytes),
                ("generic", timeit(lambda i: ck.gemv(x, w_nk[i % copies], isa="generic"), reps, repeats), nbytes),
                ("composed", timeit(lambda i: paddle.matmul(x, w_kn[i % copies]), reps, repeats), nbytes),
                ("mm_T", timeit(lambda i: paddle.matmul(x, w_nk[i % copies], transpose_y=True), reps, repeats), nbytes),
            ]
            row(f"{name} [{n}x{k}] B={b}", cols)
        del w_nk, w_kn


def bench_gemv_int8(batches, quick, repeats, budget):
    print("\n== GEMV int8 weight-only (ours) vs fp32 composed matmul and vs dequantize+matmul; cold weights")
    rng = np.random.default_rng(1)
    for name, n, k in GEMVS:
        nbytes8, nbytes32 = n * k + n * 4, n * k * 4
        copies = max(2, -(-budget // nbytes8))
        w = rng.standard_normal((n, k), dtype=np.float32)
        qs = [ck.quantize_int8(w) for _ in range(copies)]
        c32 = max(2, -(-budget // nbytes32))
        w_kn = [paddle.to_tensor(np.ascontiguousarray(w.T)) for _ in range(c32)]
        for b in batches:
            x = paddle.to_tensor(rng.standard_normal((b, k), dtype=np.float32))
            reps = max(copies, 10)
            cols = [
                ("avx2", timeit(lambda i: ck.gemv_int8(x, *qs[i % copies], isa="avx2_fma"), reps, repeats), nbytes8),
                ("generic", timeit(lambda i: ck.gemv_int8(x, *qs[i % copies], isa="generic"), reps, repeats), nbytes8),
                ("fp32 composed", timeit(lambda i: paddle.matmul(x, w_kn[i % c32]), max(c32, 10), repeats), nbytes32),
                ("dequant+mm", timeit(lambda i: paddle.matmul(x, ck.dequantize_int8(*qs[i % copies]), transpose_y=True),
                                      reps, repeats), nbytes8),
            ]
            row(f"{name} [{n}x{k}] B={b}", cols)
        del qs, w_kn


def bench_w8a8(batches, repeats, budget, threads_list=(1, 2)):
    """int8 x int8 GEMV (activations quantized in the call, groups of ck.W8A8_GROUP; vnni and avx2
    paths) vs the weight-only int8 GEMV vs the fp32 GEMV, at SmolLM2's shapes, one and two threads,
    cold weights (the "step" section adds the whole decode step's GEMVs). GB/s counts weight bytes read (int8 + scales,
    or fp32); "% bw" is that against the host's read bandwidth measured here with the same thread
    count, right before. Ratios (old / new time) come from the same command, best of `repeats`."""
    g = ck.W8A8_GROUP
    print(f"\n== wint8 GEMV: int8 x int8 (activations per row and group of {g or 'K'}) vs weight-only int8 vs fp32; "
          f"cold weights; GB/s of weight bytes, % of the read bandwidth at the same thread count")
    isas = [i for i in ("avx512_vnni", "avx2_fma") if i in ck.supported_isas()]
    old_isa = "avx2_fma" if "avx2_fma" in ck.supported_isas() else "generic"
    rng = np.random.default_rng(5)
    buf = np.ones(256 << 20, np.float32)
    bws = {}
    for threads in threads_list:
        bws[threads] = max(buf.nbytes / timed(lambda: probes.read_bandwidth_probe(buf, threads)) / 1e9
                           for _ in range(5))
        print(f"read bandwidth, {threads} thread(s): {bws[threads]:.1f} GB/s")
    del buf
    summary = []
    for name, n, k in GEMVS:  # one shape's cold copies at a time (memory)
        w = rng.standard_normal((n, k), dtype=np.float32)
        qs = [ck.quantize_int8(w) for _ in range(max(2, -(-budget // (n * k))))]
        w32 = [paddle.to_tensor(w) for _ in range(max(2, -(-budget // (n * k * 4))))]
        del w
        b8, b32 = n * k + 4 * n, n * k * 4
        for threads in threads_list:
            ck.set_num_threads(threads)
            paddle.base.core.set_num_threads(threads)
            bw = bws[threads]
            for b in batches:
                x = paddle.to_tensor(rng.standard_normal((b, k), dtype=np.float32))
                r8, r32 = max(len(qs), 10), max(len(w32), 10)
                cols = [(f"w8a8 {i}", timeit(lambda j, i=i: ck.gemv_w8a8(x, *qs[j % len(qs)], isa=i, group=g), r8,
                                             repeats), b8) for i in isas]
                cols.append((f"int8 {old_isa}", timeit(lambda j: ck.gemv_int8(x, *qs[j % len(qs)], isa=old_isa), r8,
                                                       repeats), b8))
                cols.append((f"fp32 {old_isa}", timeit(lambda j: ck.gemv(x, w32[j % len(w32)], isa=old_isa), r32,
                                                       repeats), b32))
                best_new = min(c[1] for c in cols[:len(isas)])
                print(f"{name} [{n}x{k}] B={b} T={threads}: " + "  ".join(
                    f"{lab} {sec * 1e6:8.1f} us {nb / sec / 1e9:5.1f} GB/s ({nb / sec / 1e9 / bw:4.0%} bw)"
                    for lab, sec, nb in cols) + f"  | new vs old int8 {cols[-2][1] / best_new:.2f}x, "
                    f"vs fp32 {cols[-1][1] / best_new:.2f}x", flush=True)
                summary.append((name, b, threads, cols, bw))
        del qs, w32
    ck.set_num_threads(max(threads_list))
    paddle.base.core.set_num_threads(max(threads_list))
    return summary


def bench_step(batches, repeats):
    print("\n== all GEMVs of one decode step (30 layers x 4 + lm head; 538 MB fp32, 135 MB int8)")
    rng = np.random.default_rng(2)
    layers_nk, layers_kn, layers_q = [], [], []
    for _ in range(LAYERS):
        ws = [rng.standard_normal((n, k), dtype=np.float32) for _, n, k in GEMVS[:4]]
        layers_nk.append([paddle.to_tensor(w) for w in ws])
        layers_kn.append([paddle.to_tensor(np.ascontiguousarray(w.T)) for w in ws])
        layers_q.append([ck.quantize_int8(w) for w in ws])
    lm = rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32)
    lm_t, lm_q = paddle.to_tensor(lm), ck.quantize_int8(lm)
    del lm
    total32 = sum(n * k * 4 for _, n, k in GEMVS[:4]) * LAYERS + VOCAB * HIDDEN * 4
    total8 = sum(n * k + 4 * n for _, n, k in GEMVS[:4]) * LAYERS + VOCAB * HIDDEN + 4 * VOCAB
    for b in batches:
        xs = {k: paddle.to_tensor(rng.standard_normal((b, k), dtype=np.float32)) for k in (HIDDEN, INTER)}

        def ours(_):
            for ws in layers_nk:
                for w in ws:
                    ck.gemv(xs[w.shape[1]], w, isa="avx2_fma")
            ck.gemv(xs[HIDDEN], lm_t, isa="avx2_fma")

        def ours8(_):
            for ws in layers_q:
                for q, s in ws:
                    ck.gemv_int8(xs[q.shape[1]], q, s, isa="avx2_fma")
            ck.gemv_int8(xs[HIDDEN], *lm_q, isa="avx2_fma")

        def composed(_):
            for ws in layers_kn:
                for w in ws:
                    paddle.matmul(xs[w.shape[0]], w)
            paddle.matmul(xs[HIDDEN], lm_t, transpose_y=True)  # the model's lm head (tied embedding)

        w8a8_isa = ck.supported_isas()[0]

        def ours8a8(_):  # what Int8Linear runs on a vector isa: activations quantized in the call
            for ws in layers_q:
                for q, s in ws:
                    ck.gemv_w8a8(xs[q.shape[1]], q, s, isa=w8a8_isa, group=ck.W8A8_GROUP)
            ck.gemv_w8a8(xs[HIDDEN], *lm_q, isa=w8a8_isa, group=ck.W8A8_GROUP)

        cols = [("avx2", timeit(ours, 1, repeats), total32), ("int8 avx2", timeit(ours8, 1, repeats), total8),
                (f"w8a8 {w8a8_isa}", timeit(ours8a8, 1, repeats), total8),
                ("composed", timeit(composed, 1, repeats), total32)]
        row(f"step GEMVs B={b}", cols)
        print(f"{'':<28}  -> GEMV-bound tokens/s at B={b}: ours fp32 {b / cols[0][1]:.0f}, ours int8 "
              f"{b / cols[1][1]:.0f}, ours w8a8 {b / cols[2][1]:.0f}, composed {b / cols[3][1]:.0f}")


def bench_crossover(repeats, budget):
    """Where paddle.matmul (MKL) on the same [N, K] weight overtakes our GEMV: the measurement behind
    cpu_kernels.GEMV_MAX_BATCH."""
    print(f"\n== GEMV vs paddle.matmul(x, W_nk, transpose_y=True) by batch (cold weights; linear() switches "
          f"above GEMV_MAX_BATCH={ck.GEMV_MAX_BATCH}, int8 above GEMV_INT8_MAX_BATCH={ck.GEMV_INT8_MAX_BATCH})")
    rng = np.random.default_rng(8)
    for name, n, k in (GEMVS[2], GEMVS[3]):
        copies = max(2, -(-budget // (n * k * 4)))
        w_nk = [paddle.to_tensor(rng.standard_normal((n, k), dtype=np.float32)) for _ in range(copies)]
        w_kn = [paddle.to_tensor(np.ascontiguousarray(w.numpy().T)) for w in w_nk]
        q8 = [ck.quantize_int8(w) for w in w_nk[: max(2, copies // 4)]]
        for b in (1, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 1024):
            x = paddle.to_tensor(rng.standard_normal((b, k), dtype=np.float32))
            reps = max(copies, 10)
            ours = timeit(lambda i: ck.gemv(x, w_nk[i % copies], isa="avx2_fma"), reps, repeats)
            mm = timeit(lambda i: paddle.matmul(x, w_nk[i % copies], transpose_y=True), reps, repeats)
            mm_kn = timeit(lambda i: paddle.matmul(x, w_kn[i % copies]), reps, repeats)
            o8 = timeit(lambda i: ck.gemv_int8(x, *q8[i % len(q8)], isa="avx2_fma"), reps, repeats)
            d8 = timeit(lambda i: paddle.matmul(x, ck.dequantize_int8(*q8[i % len(q8)]), transpose_y=True), reps,
                        repeats)
            print(f"{name + ' B=' + str(b):<28}  gemv {ours * 1e6:9.1f} us  matmul {mm * 1e6:9.1f} us  "
                  f"(matmul/gemv {mm / ours:5.2f}; W_kn layout {mm_kn * 1e6:9.1f} us)  int8 {o8 * 1e6:9.1f} us  dequant+matmul {d8 * 1e6:9.1f} us  "
                  f"({d8 / o8:5.2f})", flush=True)
        del w_nk, w_kn, q8
