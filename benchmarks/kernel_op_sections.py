"""The other op sections of benchmarks/bench_kernels.py (microseconds per call; GB/s where bytes are
known): rotary + KV write (rotary), paged decode attention (attn), add + RMSNorm (norm), the threads
of small ops (threads) and a whole SmolLM2 decode step, composed ops against our kernels (decoder)."""

from __future__ import annotations

import numpy as np
import paddle

import kernel_probes as probes  # noqa: I001 (this folder, run as a script)
import paddle_llm_ops.cpu_kernels as ck
from kernel_timing import HEAD_DIM, HEADS, HIDDEN, INTER, KV_HEADS, LAYERS, VOCAB, paged_layout, row, timeit
from paddle_llm_ops.kv_cache import write_kv
from paddle_llm_ops.norm import rms_norm_composed, rms_norm_fused
from paddle_llm_ops.paged_attention import decode_attention
from paddle_llm_ops.rotary import RotaryTable, apply_rotary


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
        lens, nblocks, tables, dslots, mask = paged_layout(rng, b, ctx, bs)
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


def bench_threading(repeats):
    print("\n== threads for small ops: fork/join on the kernels' thread pool, and ops forced onto "
          f"{ck.get_num_threads()} threads ('always') vs one thread ('never') vs the thresholds ('auto')")
    n = ck.get_num_threads()
    for idle in (0, 20, 1000):
        print(f"empty pool job of {n} threads after {idle} us serial work: "
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


def bench_decoder_step(batches, ctx, repeats, fused_ok: bool):
    """A whole SmolLM2 decode step (random weights, 30 layers, lm head) written twice: with the
    composed ops as models/llama.py calls them today, and with our kernels. Not the engine: no
    sampling, no runner; the same tensors in, logits out (checked to agree)."""
    print(f"\n== decoder step, 30 layers + lm head, B decodes at contexts uniform in [{ctx // 2}, {3 * ctx // 2}] "
          "(composed = the model's ops today" + (", RMSNorm fused" if fused_ok else "") + "; ours = our kernels, "
          f"GEMV through linear(): paddle.matmul above {ck.GEMV_MAX_BATCH} rows, int8 above {ck.GEMV_INT8_MAX_BATCH})")
    rng = np.random.default_rng(7)
    w = _decoder_weights(rng)
    w["norm"] = rms_norm_fused if fused_ok else rms_norm_composed
    for b in batches:
        x = _decoder_inputs(rng, b, ctx, w["bs"])
        composed, ours = _decoder_step_fns(w, x)
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
        del x, composed, ours  # the KV caches: one batch's at a time


def _decoder_weights(rng) -> dict:
    """Random SmolLM2 weights in the three layouts the step uses ([N, K], [K, N], int8 + scales)."""
    layers = []
    for _ in range(LAYERS):
        ws = {"qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "o": (HIDDEN, HEADS * HEAD_DIM),
              "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
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
    return {"layers": layers, "embed": embed, "final_norm": paddle.to_tensor(np.ones(HIDDEN, np.float32)),
            "lm_q": ck.quantize_int8(embed), "table": RotaryTable(HEAD_DIM, 8192, 100000.0), "bs": 64,
            "scale": HEAD_DIM ** -0.5}


def _decoder_inputs(rng, b: int, ctx: int, bs: int) -> dict:
    """One decode step of B sequences: paged KV caches of every layer, the new token's slot and
    position, the block tables (ours) and the dense slots and mask (composed)."""
    lens, nblocks, tables, dslots, mask = paged_layout(rng, b, ctx, bs)
    new_pos = lens - 1  # the token of this step sits at the last context position
    caches = [(paddle.to_tensor(rng.standard_normal((KV_HEADS, nblocks * bs, HEAD_DIM), dtype=np.float32)),
               paddle.to_tensor(rng.standard_normal((KV_HEADS, nblocks * bs, HEAD_DIM), dtype=np.float32)))
              for _ in range(LAYERS)]
    return {"b": b, "slot_mapping": paddle.to_tensor(dslots[np.arange(b), new_pos]),
            "positions": paddle.to_tensor(new_pos.astype(np.int64)), "caches": caches,
            "ids": paddle.to_tensor(rng.integers(0, VOCAB, b).astype(np.int64)),
            "ds": paddle.to_tensor(dslots), "dm": paddle.to_tensor(mask),
            "bt": paddle.to_tensor(tables), "cl": paddle.to_tensor(lens.astype(np.int32))}


def _decoder_step_fns(w: dict, x: dict):
    """(composed(_), ours(_, isa, int8)): the step's logits, with the model's ops and with our kernels."""
    import paddle.nn.functional as F

    layers, embed, final_norm, norm, table = w["layers"], w["embed"], w["final_norm"], w["norm"], w["table"]
    lm_q, scale = w["lm_q"], w["scale"]
    b, caches, slot_mapping, positions = x["b"], x["caches"], x["slot_mapping"], x["positions"]

    def composed(_):
        h = paddle.index_select(embed, x["ids"], axis=0)
        cos, sin = table.lookup(positions)
        for lay, (kc, vc) in zip(layers, caches):
            xn = norm(h, lay["in_norm"], 1e-5)
            q, k, v = paddle.split(paddle.matmul(xn, lay["qkv_kn"]), [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM,
                                                                        KV_HEADS * HEAD_DIM], axis=-1)
            q = apply_rotary(q.reshape([b, HEADS, HEAD_DIM]), cos, sin)
            k = apply_rotary(k.reshape([b, KV_HEADS, HEAD_DIM]), cos, sin)
            write_kv(kc, vc, k, v.reshape([b, KV_HEADS, HEAD_DIM]), slot_mapping)
            attn = decode_attention(q, kc, vc, x["ds"], x["dm"], scale)
            h = h + paddle.matmul(attn, lay["o_kn"])
            h = h + paddle.matmul(F.swiglu(paddle.matmul(norm(h, lay["post_norm"], 1e-5), lay["gate_up_kn"])),
                                  lay["down_kn"])
        return paddle.matmul(norm(h, final_norm, 1e-5), embed, transpose_y=True)

    def ours(_, isa="avx2_fma", int8=False):
        if int8:
            lin = lambda xs, key, lay: ck.linear_int8(xs, *lay[key + "_q"], isa=isa)  # noqa: E731
        else:
            lin = lambda xs, key, lay: ck.linear(xs, lay[key + "_nk"], isa=isa)  # noqa: E731
        h = paddle.index_select(embed, x["ids"], axis=0)
        xn = ck.rms_norm(h, layers[0]["in_norm"], 1e-5, isa=isa)
        for li, (lay, (kc, vc)) in enumerate(zip(layers, caches)):
            qkv = lin(xn, "qkv", lay)
            q = ck.rotary_kv_write(qkv, positions, table.cos, table.sin, kc, vc, slot_mapping, HEADS, KV_HEADS,
                                   isa=isa)
            attn = ck.paged_decode_attention(q, kc, vc, x["bt"], x["cl"], scale, w["bs"], isa=isa)
            xn, h = ck.add_rms_norm(lin(attn, "o", lay), h, lay["post_norm"], 1e-5, isa=isa)
            down = lin(F.swiglu(lin(xn, "gate_up", lay)), "down", lay)
            nxt = layers[li + 1]["in_norm"] if li + 1 < LAYERS else final_norm
            xn, h = ck.add_rms_norm(down, h, nxt, 1e-5, isa=isa)
        if int8:
            return ck.linear_int8(xn, *lm_q, isa=isa)
        return ck.linear(xn, embed, isa=isa)

    return composed, ours
