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
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import paddle

import kernel_probes as probes  # noqa: I001 (this folder, run as a script)
import paddle_llm_ops.cpu_kernels as ck
from paddle_llm_ops.kv_cache import write_kv
from paddle_llm_ops.norm import rms_norm_composed, rms_norm_fused
from paddle_llm_ops.paged_attention import decode_attention
from paddle_llm_ops.rotary import RotaryTable, apply_rotary

# SmolLM2-135M
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 576, 9, 3, 64, 1536, 49152, 30
GEMVS = [("qkv", (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), ("o", HIDDEN, HEADS * HEAD_DIM),
         ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER), ("lm_head", VOCAB, HIDDEN)]


def cpu_model() -> tuple[str, list[str]]:
    name, flags = platform.processor() or "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("unknown", "x86_64", ""):
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    keep = [f for f in flags if f in ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "amx_tile")]
    return name, keep


def l3_bytes() -> int:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            s = f.read().strip()
        return int(s[:-1]) * (1024 if s.endswith("K") else 1024 * 1024 if s.endswith("M") else 1)
    except (OSError, ValueError):
        return 64 << 20


def timeit(fn, reps: int, repeats: int) -> float:
    """Minimum over `repeats` of the mean seconds per call over `reps` calls (after a warm-up)."""
    fn(0)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(reps):
            fn(i)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def row(name: str, cols: list[tuple[str, float, float | None]]) -> None:
    parts = [f"{name:<28}"]
    for label, sec, nbytes in cols:
        gbs = f" {nbytes / sec / 1e9:5.1f} GB/s" if nbytes else ""
        parts.append(f"{label} {sec * 1e6:9.1f} us{gbs}")
    print("  ".join(parts), flush=True)


def bench_bandwidth(quick: bool) -> float:
    buf = np.ones((64 if quick else 256) << 20, np.float32)
    out = 0.0
    for threads in sorted({1, ck.get_num_threads()}):
        best = min(_timed(lambda: probes.read_bandwidth_probe(buf, threads)) for _ in range(5))
        gbs = buf.nbytes / best / 1e9
        print(f"read bandwidth, {threads} thread(s), AVX2 sum over {buf.nbytes >> 20} MiB: {gbs:.1f} GB/s")
        out = max(out, gbs)
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


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
        bws[threads] = max(buf.nbytes / _timed(lambda: probes.read_bandwidth_probe(buf, threads)) / 1e9
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


def bench_rotary(batches, repeats):
    print("\n== rotary + KV write, one layer (ours fused; composed = split, 2x apply_rotary, write_kv)")
    rng = np.random.default_rng(3)
    table = RotaryTable(HEAD_DIM, 8192, 100000.0)
    slots_total = 4096 * 64
    kc = paddle.zeros([KV_HEADS, slots_total, HEAD_DIM])
    vc = paddle.zeros([KV_HEADS, slots_total, HEAD_DIM])
    for b in batches:
        qkv = paddle.to_tensor(rng.standard_normal((b, (HEADS + 2 * KV_HEADS) * HEAD_DIM), dtype=np.float32))
        pos = paddle.to_tensor(rng.integers(0, 8192, b).astype(np.int64))
        slots = paddle.to_tensor(rng.permutation(slots_total)[:b].astype(np.int64))

        def composed(_):
            q, k, v = paddle.split(qkv, [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], axis=-1)
            cos, sin = table.lookup(pos)
            q = apply_rotary(q.reshape([b, HEADS, HEAD_DIM]), cos, sin)
            k = apply_rotary(k.reshape([b, KV_HEADS, HEAD_DIM]), cos, sin)
            write_kv(kc, vc, k, v.reshape([b, KV_HEADS, HEAD_DIM]), slots)

        cols = [(isa_label, timeit(lambda _, i=isa: ck.rotary_kv_write(qkv, pos, table.cos, table.sin, kc, vc, slots,
                                                                       HEADS, KV_HEADS, isa=i), 200, repeats), None)
                for isa_label, isa in (("avx2", "avx2_fma"), ("generic", "generic"))]
        cols.append(("composed", timeit(composed, 200, repeats), None))
        row(f"rotary_kv B={b}", cols)


def bench_attention(batches, ctx, repeats):
    print(f"\n== paged decode attention, one layer, contexts uniform in [{ctx // 2}, {3 * ctx // 2}], block 64, "
          "shuffled block tables (composed = index_select gather padded to the longest + masked softmax)")
    rng = np.random.default_rng(4)
    bs = 64
    for b in batches:
        lens = rng.integers(ctx // 2, 3 * ctx // 2 + 1, b)
        need = [-(-int(c) // bs) for c in lens]
        nblocks = sum(need) + 8
        ids = rng.permutation(nblocks)
        tables = np.zeros((b, max(need)), np.int32)
        used = 0
        width = int(lens.max())
        dslots = np.zeros((b, width), np.int64)
        mask = np.full((1, b, 1, width), -np.inf, np.float32)
        for i, (c, n) in enumerate(zip(lens, need)):
            tables[i, :n] = ids[used:used + n]
            used += n
            p = np.arange(c)
            dslots[i, :c] = tables[i, p // bs].astype(np.int64) * bs + p % bs
            mask[0, i, 0, :c] = 0
        kc = paddle.to_tensor(rng.standard_normal((KV_HEADS, nblocks * bs, HEAD_DIM), dtype=np.float32))
        vc = paddle.to_tensor(rng.standard_normal((KV_HEADS, nblocks * bs, HEAD_DIM), dtype=np.float32))
        q = paddle.to_tensor(rng.standard_normal((b, HEADS, HEAD_DIM), dtype=np.float32))
        bt, cl = paddle.to_tensor(tables), paddle.to_tensor(lens.astype(np.int32))
        ds, dm = paddle.to_tensor(dslots), paddle.to_tensor(mask)
        kv_bytes = int(lens.sum()) * KV_HEADS * HEAD_DIM * 4 * 2
        scale = HEAD_DIM ** -0.5
        cols = [(lab, timeit(lambda _, i=isa: ck.paged_decode_attention(q, kc, vc, bt, cl, scale, bs, isa=i), 50,
                             repeats), kv_bytes) for lab, isa in (("avx2", "avx2_fma"), ("generic", "generic"))]
        cols.append(("composed", timeit(lambda _: decode_attention(q, kc, vc, ds, dm, scale), 50, repeats), kv_bytes))
        row(f"decode_attention B={b}", cols)


def bench_norm(batches, repeats, fused_ok: bool):
    print("\n== add + RMSNorm, [B, 576] (ours one pass; composed = h + x then rms_norm_composed"
          + ("; fused = h + x then Paddle's fused_rms_norm" if fused_ok else "") + ")")
    rng = np.random.default_rng(5)
    w = paddle.to_tensor(rng.standard_normal(HIDDEN, dtype=np.float32))
    for b in batches:
        x = paddle.to_tensor(rng.standard_normal((b, HIDDEN), dtype=np.float32))
        r = paddle.to_tensor(rng.standard_normal((b, HIDDEN), dtype=np.float32))
        cols = [(lab, timeit(lambda _, i=isa: ck.add_rms_norm(x, r, w, 1e-5, isa=i), 500, repeats), None)
                for lab, isa in (("avx2", "avx2_fma"), ("generic", "generic"))]
        cols.append(("composed", timeit(lambda _: rms_norm_composed(x + r, w, 1e-5), 500, repeats), None))
        if fused_ok:
            cols.append(("fused", timeit(lambda _: rms_norm_fused(x + r, w, 1e-5), 500, repeats), None))
        row(f"add_rms_norm B={b}", cols)


def bench_decoder_step(batches, ctx, repeats, fused_ok: bool):
    """A whole SmolLM2 decode step (random weights, 30 layers, lm head) written twice: with the
    composed ops as models/llama.py calls them today, and with our kernels. Not the engine: no
    sampling, no runner; the same tensors in, logits out (checked to agree)."""
    import paddle.nn.functional as F

    print(f"\n== decoder step, 30 layers + lm head, B decodes at contexts uniform in [{ctx // 2}, {3 * ctx // 2}] "
          "(composed = the model's ops today" + (", RMSNorm fused" if fused_ok else "") + "; ours = our kernels, "
          f"GEMV through linear(): paddle.matmul above {ck.GEMV_MAX_BATCH} rows, int8 above {ck.GEMV_INT8_MAX_BATCH})")
    rng = np.random.default_rng(7)
    bs = 64
    qkv_n = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    layers = []
    for _ in range(LAYERS):
        ws = {"qkv": (qkv_n, HIDDEN), "o": (HIDDEN, HEADS * HEAD_DIM), "gate_up": (2 * INTER, HIDDEN),
              "down": (HIDDEN, INTER)}
        lay = {}
        for key, (n, k) in ws.items():
            w = (rng.standard_normal((n, k), dtype=np.float32) / np.sqrt(k)).astype(np.float32)
            lay[key + "_nk"] = paddle.to_tensor(w)
            lay[key + "_kn"] = paddle.to_tensor(np.ascontiguousarray(w.T))
        lay.update({key + "_q": ck.quantize_int8(lay[key + "_nk"]) for key in ws})
        lay["in_norm"] = paddle.to_tensor((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        lay["post_norm"] = paddle.to_tensor((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        layers.append(lay)
    embed = paddle.to_tensor(rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32))
    final_norm = paddle.to_tensor(np.ones(HIDDEN, np.float32))
    lm_q = ck.quantize_int8(embed)
    table = RotaryTable(HEAD_DIM, 8192, 100000.0)
    norm = rms_norm_fused if fused_ok else rms_norm_composed
    scale = HEAD_DIM ** -0.5
    for b in batches:
        lens = rng.integers(ctx // 2, 3 * ctx // 2 + 1, b)
        need = [-(-int(c) // bs) for c in lens]
        nblocks = sum(need) + 8
        ids = rng.permutation(nblocks)
        tables = np.zeros((b, max(need)), np.int32)
        width = int(lens.max())
        dslots = np.zeros((b, width), np.int64)
        mask = np.full((1, b, 1, width), -np.inf, np.float32)
        used = 0
        for i, (c, n) in enumerate(zip(lens, need)):
            tables[i, :n] = ids[used:used + n]
            used += n
            p = np.arange(c)
            dslots[i, :c] = tables[i, p // bs].astype(np.int64) * bs + p % bs
            mask[0, i, 0, :c] = 0
        new_pos = lens - 1  # the token of this step sits at the last context position
        slot_mapping = paddle.to_tensor(dslots[np.arange(b), new_pos])
        positions = paddle.to_tensor(new_pos.astype(np.int64))
        caches = [(paddle.to_tensor(rng.standard_normal((KV_HEADS, nblocks * bs, HEAD_DIM), dtype=np.float32)),
                   paddle.to_tensor(rng.standard_normal((KV_HEADS, nblocks * bs, HEAD_DIM), dtype=np.float32)))
                  for _ in range(LAYERS)]
        ids_t = paddle.to_tensor(rng.integers(0, VOCAB, b).astype(np.int64))
        ds, dm = paddle.to_tensor(dslots), paddle.to_tensor(mask)
        bt, cl = paddle.to_tensor(tables), paddle.to_tensor(lens.astype(np.int32))

        def composed(_):
            h = paddle.index_select(embed, ids_t, axis=0)
            cos, sin = table.lookup(positions)
            for lay, (kc, vc) in zip(layers, caches):
                x = norm(h, lay["in_norm"], 1e-5)
                q, k, v = paddle.split(paddle.matmul(x, lay["qkv_kn"]), [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM,
                                                                           KV_HEADS * HEAD_DIM], axis=-1)
                q = apply_rotary(q.reshape([b, HEADS, HEAD_DIM]), cos, sin)
                k = apply_rotary(k.reshape([b, KV_HEADS, HEAD_DIM]), cos, sin)
                write_kv(kc, vc, k, v.reshape([b, KV_HEADS, HEAD_DIM]), slot_mapping)
                attn = decode_attention(q, kc, vc, ds, dm, scale)
                h = h + paddle.matmul(attn, lay["o_kn"])
                h = h + paddle.matmul(F.swiglu(paddle.matmul(norm(h, lay["post_norm"], 1e-5), lay["gate_up_kn"])),
                                      lay["down_kn"])
            return paddle.matmul(norm(h, final_norm, 1e-5), embed, transpose_y=True)

        def ours(_, isa="avx2_fma", int8=False):
            if int8:
                lin = lambda x, key, lay: ck.linear_int8(x, *lay[key + "_q"], isa=isa)  # noqa: E731
            else:
                lin = lambda x, key, lay: ck.linear(x, lay[key + "_nk"], isa=isa)  # noqa: E731
            h = paddle.index_select(embed, ids_t, axis=0)
            x = ck.rms_norm(h, layers[0]["in_norm"], 1e-5, isa=isa)
            for li, (lay, (kc, vc)) in enumerate(zip(layers, caches)):
                qkv = lin(x, "qkv", lay)
                q = ck.rotary_kv_write(qkv, positions, table.cos, table.sin, kc, vc, slot_mapping, HEADS, KV_HEADS,
                                       isa=isa)
                attn = ck.paged_decode_attention(q, kc, vc, bt, cl, scale, bs, isa=isa)
                x, h = ck.add_rms_norm(lin(attn, "o", lay), h, lay["post_norm"], 1e-5, isa=isa)
                down = lin(F.swiglu(lin(x, "gate_up", lay)), "down", lay)
                nxt = layers[li + 1]["in_norm"] if li + 1 < LAYERS else final_norm
                x, h = ck.add_rms_norm(down, h, nxt, 1e-5, isa=isa)
            if int8:
                return ck.linear_int8(x, *lm_q, isa=isa)
            return ck.linear(x, embed, isa=isa)

        ref, got = composed(0).numpy(), ours(0).numpy()
        got8 = ours(0, int8=True).numpy()
        agree = np.abs(got - ref).max() / np.abs(ref).max()
        agree8 = np.abs(got8 - ref).max() / np.abs(ref).max()
        top8 = float((got8.argmax(-1) == ref.argmax(-1)).mean())
        t_c = timeit(composed, 1, repeats)
        t_o = timeit(ours, 1, repeats)
        t_8 = timeit(lambda i: ours(i, int8=True), 1, repeats)
        t_g = timeit(lambda i: ours(i, "generic"), 1, max(2, repeats // 2))
        row(f"decoder step B={b}", [("avx2", t_o, None), ("int8 avx2", t_8, None), ("generic", t_g, None),
                                    ("composed", t_c, None)])
        print(f"{'':<28}  -> tokens/s: ours {b / t_o:.0f}, ours int8 {b / t_8:.0f}, composed {b / t_c:.0f} "
              f"({t_c / t_o:.2f}x); logits vs composed: fp32 {agree:.1e}, int8 {agree8:.1e} of max |logit|, "
              f"int8 argmax agreement {top8:.2f} (random weights)")
        del caches


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


def bench_threading(repeats):
    print("\n== threads for small ops: OpenMP fork/join on the kernels' runtime, and ops forced onto "
          f"{ck.get_num_threads()} threads ('always') vs one thread ('never') vs the thresholds ('auto')")
    n = ck.get_num_threads()
    for idle in (0, 20, 1000):
        print(f"empty parallel region of {n} threads after {idle} us serial work: "
              f"{min(probes.fork_join_probe(2000 if idle < 100 else 200, n, idle) for _ in range(3)):.2f} us")
    rng = np.random.default_rng(6)
    table = RotaryTable(HEAD_DIM, 4096, 100000.0)
    kc = paddle.zeros([KV_HEADS, 8192, HEAD_DIM])
    vc = paddle.zeros([KV_HEADS, 8192, HEAD_DIM])
    w = paddle.to_tensor(rng.standard_normal(HIDDEN, dtype=np.float32))
    for b in (1, 32):
        qkv = paddle.to_tensor(rng.standard_normal((b, (HEADS + 2 * KV_HEADS) * HEAD_DIM), dtype=np.float32))
        pos = paddle.to_tensor(rng.integers(0, 4096, b).astype(np.int64))
        slots = paddle.to_tensor(rng.permutation(8192)[:b].astype(np.int64))
        x = paddle.to_tensor(rng.standard_normal((b, HIDDEN), dtype=np.float32))
        ops = {"rotary_kv": lambda _: ck.rotary_kv_write(qkv, pos, table.cos, table.sin, kc, vc, slots, HEADS, KV_HEADS,
                                                          isa="avx2_fma"),
               "add_rms_norm": lambda _: ck.add_rms_norm(x, x, w, 1e-5, isa="avx2_fma")}
        for name, fn in ops.items():
            cols = []
            for policy in ("auto", "never", "always"):
                probes.set_threading_policy(policy)
                cols.append((policy, timeit(fn, 500, repeats), None))
            probes.set_threading_policy("auto")
            row(f"{name} B={b}", cols)


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
