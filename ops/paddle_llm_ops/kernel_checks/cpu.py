"""Checks of the CPU place's optional kernels (see kernel_checks/__init__.py for the contract).

- "cpu_kernels": every op of paddle_llm_ops.cpu_kernels the cpu OpSet calls (rms_norm, add_rms_norm,
  the fp32 GEMV, int8 quantization and GEMV, the int8 x int8 GEMV of wint8 (activations quantized in
  the call), the int4 GEMV, rotary + paged
  KV write, paged decode attention), on the dispatch path given as `isa`, against composed Paddle
  ops written here (independent of the kernels' own code). fp32 only: the kernels have no other.
- "fused_rms_norm": Paddle's paddle.incubate.nn.functional.fused_rms_norm against the composed
  RMSNorm. Its CPU kernel runs AVX-512 instructions on any CPU (SIGILL on an AVX2-only host), so the
  check is isolated (a child process).

Shapes: GQA (query heads a multiple of KV heads), several sequences, a ragged decode batch whose
context lengths sit on both sides of KV block boundaries (1, block, block + 1, 2 blocks, 3 blocks
- 1), shuffled block ids, a K that is not a multiple of the kernels' 8-lane width.
"""

from __future__ import annotations

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_ops.kernel_checks import difference, random_array, register, worst

_EPS = 1e-6
_BLOCK = 16


def _t(a: np.ndarray) -> paddle.Tensor:
    return from_numpy(a)


def _rms_composed(x: paddle.Tensor, w: paddle.Tensor, eps: float) -> paddle.Tensor:
    return x * paddle.rsqrt((x * x).mean(axis=-1, keepdim=True) + eps) * w


def _library_build() -> str:
    """The built C++ library's folder name (it carries the hash of its sources and flags)."""
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.load().parent.name


def _norm_parts(ck, rng, isa: str) -> dict[str, tuple[float, float]]:
    x, delta, w = random_array(rng, (7, 200)), random_array(rng, (7, 200)), random_array(rng, (200,))
    out = {"rms_norm": difference(ck.rms_norm(_t(x), _t(w), _EPS, isa), _rms_composed(_t(x), _t(w), _EPS))}
    y, s = ck.add_rms_norm(_t(delta), _t(x), _t(w), _EPS, isa)
    s_ref = _t(x) + _t(delta)
    out["add_rms_norm"] = difference(y, _rms_composed(s_ref, _t(w), _EPS))
    out["add_rms_norm residual"] = difference(s, s_ref)
    return out


def _swiglu_parts(ck, rng, isa: str) -> dict[str, tuple[float, float]]:
    """SwiGLU (the op-by-op path's and the decode stack's) against Paddle's F.swiglu."""
    import paddle.nn.functional as F

    gu = random_array(rng, (5, 2 * 136)) * 4
    return {"swiglu": difference(ck.swiglu(_t(gu), isa), F.swiglu(_t(gu)))}


def _linear_parts(ck, rng, isa: str) -> dict[str, tuple[float, float]]:
    """fp32 GEMV and int8 quantization + GEMV at decode batch sizes (1, 5, the GEMV limit)."""
    n, k = 72, 203
    w, bias = random_array(rng, (n, k)), random_array(rng, (n,))
    q, s = ck.quantize_int8(_t(w))
    q_np, s_np = ck.quantize_int8_numpy(w)
    out = {"quantize_int8": difference(q.astype("float32"), q_np.astype(np.float32)),
           "quantize_int8 scale": difference(s, s_np)}
    deq = _t(q_np.astype(np.float32) * s_np[:, None])
    for b in (1, 5, ck.GEMV_MAX_BATCH):
        x = _t(random_array(rng, (b, k)))
        ref = paddle.matmul(x, _t(w), transpose_y=True)
        out[f"gemv batch {b}"] = difference(ck.gemv(x, _t(w), None, isa), ref)
        out[f"gemv+bias batch {b}"] = difference(ck.gemv(x, _t(w), _t(bias), isa), ref + _t(bias))
        out[f"gemv_int8 batch {b}"] = difference(ck.gemv_int8(x, q, s, _t(bias), isa),
                                                 paddle.matmul(x, deq, transpose_y=True) + _t(bias))
    out.update(_w8a8_parts(ck, rng, isa, w, q_np, s_np, bias))
    out.update(_int4_parts(ck, rng, isa))
    return out


def _w8a8_parts(ck, rng, isa: str, w, q_np, s_np, bias) -> dict[str, tuple[float, float]]:
    """The int8 x int8 GEMV (gemv_w8a8), where the library has it:
    - its integer core (int8_dot_groups) against numpy int64 sums: exact (difference 0);
    - the GEMV against the composed matmul of the dequantized activations xq * xs (quantized here in
      numpy) and the dequantized weights: fp32 rounding only, under the usual tolerance;
    - the GEMV against the composed matmul of the fp32 activations: the difference may be as large
      as activation rounding allows, |x - xq xs| <= xs / 2 per element, so per output
      bound = (xs / 2) * sum_k |q[n, k] scale[n]| (+ 1e-5 relative for the fp32 sums); the part
      reports by how much the difference exceeds that bound (0 when within it)."""
    if not hasattr(ck, "gemv_w8a8"):
        return {}
    n, k = q_np.shape
    deq = _t(q_np.astype(np.float32) * s_np[:, None])
    out = {}
    for b, group in ((1, 0), (5, 0), (ck.GEMV_MAX_BATCH, 0), (3, 64)):
        x_np = random_array(rng, (b, k))
        xq, xs = ck.quantize_activations_numpy(x_np, group)
        g = k if group <= 0 or group >= k else group
        exact = np.stack([xq[:, j * g:(j + 1) * g].astype(np.int64) @ q_np[:, j * g:(j + 1) * g].astype(np.int64).T
                          for j in range(xs.shape[1])], axis=-1)
        out[f"int8_dot_groups group {group} batch {b}"] = difference(
            ck.int8_dot_groups(_t(xq), _t(q_np), group, isa).astype("float64"), exact.astype(np.float64))
        xdeq = xq.astype(np.float32) * np.repeat(xs, g, axis=1)[:, :k]
        got = ck.gemv_w8a8(_t(x_np), _t(q_np), _t(s_np), _t(bias), isa, group)
        out[f"gemv_w8a8 group {group} batch {b}"] = difference(
            got, paddle.matmul(_t(xdeq), deq, transpose_y=True) + _t(bias))
        ref = paddle.matmul(_t(x_np), deq, transpose_y=True) + _t(bias)
        err = np.abs(got.numpy().astype(np.float64) - ref.numpy())
        half_step = np.repeat(xs, g, axis=1)[:, :k].astype(np.float64) / 2
        bound = half_step @ np.abs(q_np.astype(np.float64) * s_np[:, None]).T
        bound += 1e-5 * np.maximum(1.0, np.abs(ref.numpy()))
        out[f"gemv_w8a8 group {group} batch {b} vs fp32 activations (over the rounding bound)"] = (
            float(np.maximum(err - bound, 0).max()), float(np.abs(ref.numpy()).max()))
    return out


def _unpack_int4(q: np.ndarray, scale: np.ndarray, k: int) -> np.ndarray:
    """The fp32 [N, k] weight of packed int4 (two's complement nibbles, even k in the low one) times
    its per-group scales [N, k / G], written here from the documented layout."""
    lo = (q & 0x0F).astype(np.int16)
    hi = (q >> 4).astype(np.int16)
    vals = np.stack([np.where(lo > 7, lo - 16, lo), np.where(hi > 7, hi - 16, hi)], axis=-1).reshape(q.shape[0], -1)
    group = k // scale.shape[1]
    return vals[:, :k].astype(np.float32) * np.repeat(scale, group, axis=1)


def _int4_parts(ck, rng, isa: str) -> dict[str, tuple[float, float]]:
    """The int4 GEMV (wint4) per output channel and in groups of 64, where the library has it."""
    if not hasattr(ck, "gemv_int4"):
        return {}
    n, k = 40, 192
    w, bias = random_array(rng, (n, k)), random_array(rng, (n,))
    out = {}
    for group in (-1, 64):
        q, s = ck.quantize_int4_numpy(w, group)
        ref_w = _t(_unpack_int4(q, s, k))
        out[f"dequantize_int4 group {group}"] = difference(ck.dequantize_int4(_t(q), _t(s), k, isa), ref_w)
        for b in (1, 4):
            x = _t(random_array(rng, (b, k)))
            out[f"gemv_int4 group {group} batch {b}"] = difference(
                ck.gemv_int4(x, _t(q), _t(s), _t(bias), isa), paddle.matmul(x, ref_w, transpose_y=True) + _t(bias))
    return out


def _rotary_reference(qkv, positions, cos, sin, k_cache, v_cache, slots, nh, kvh, q_norm, k_norm):
    """Composed rotate-half rotary (RoFormer; HF Llama) + KV write: returns q [T, nh, d]; writes
    k, v at slots (caches [kvh, slots, d])."""
    t, d = qkv.shape[0], cos.shape[1]
    q, k, v = paddle.split(qkv, [nh * d, kvh * d, kvh * d], axis=-1)
    q, k, v = q.reshape([t, nh, d]), k.reshape([t, kvh, d]), v.reshape([t, kvh, d])
    if q_norm is not None:
        q, k = _rms_composed(q, q_norm, _EPS), _rms_composed(k, k_norm, _EPS)
    c = paddle.index_select(cos, positions, axis=0).unsqueeze(1)
    s = paddle.index_select(sin, positions, axis=0).unsqueeze(1)

    def rotate(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * c + paddle.concat([-x2, x1], axis=-1) * s

    q, k = rotate(q), rotate(k)
    heads = paddle.arange(kvh, dtype="int64").unsqueeze(1)
    paddle.index_put_(k_cache, (heads, slots.unsqueeze(0)), k.transpose([1, 0, 2]))
    paddle.index_put_(v_cache, (heads, slots.unsqueeze(0)), v.transpose([1, 0, 2]))
    return q


def _rotary_parts(ck, rng, isa: str) -> dict[str, tuple[float, float]]:
    """rotary_kv_write with GQA (6 query heads over 2 KV heads), with and without q/k norms."""
    nh, kvh, d, tokens, max_pos = 6, 2, 32, 9, 64
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    ang = np.outer(np.arange(max_pos), inv)
    cos = _t(np.cos(np.concatenate([ang, ang], -1)).astype(np.float32))
    sin = _t(np.sin(np.concatenate([ang, ang], -1)).astype(np.float32))
    positions = _t(rng.integers(0, max_pos, tokens).astype(np.int64))
    slots = _t(rng.choice(4 * _BLOCK, tokens, replace=False).astype(np.int64))
    out = {}
    for with_norm in (False, True):
        qkv = _t(random_array(rng, (tokens, (nh + 2 * kvh) * d)))
        qn, kn = (_t(random_array(rng, (d,))), _t(random_array(rng, (d,)))) if with_norm else (None, None)
        init = random_array(rng, (kvh, 4 * _BLOCK, d))
        caches = [_t(init), _t(init), _t(init), _t(init)]  # kernel k, v; composed k, v
        q = ck.rotary_kv_write(qkv, positions, cos, sin, caches[0], caches[1], slots, nh, kvh, qn, kn, _EPS, isa)
        q_ref = _rotary_reference(qkv, positions, cos, sin, caches[2], caches[3], slots, nh, kvh, qn, kn)
        tag = " with q/k norm" if with_norm else ""
        out[f"rotary q{tag}"] = difference(q, q_ref)
        out[f"rotary k cache{tag}"] = difference(caches[0], caches[2])
        out[f"v cache{tag}"] = difference(caches[1], caches[3])
    return out


def _decode_reference(q, k_cache, v_cache, tables: np.ndarray, lens, scale: float) -> paddle.Tensor:
    """Composed decode attention, one sequence at a time: gather its slots, repeat the KV heads for
    GQA, softmax(q k^T * scale) v. Returns [B, nh * d]."""
    nh, kvh = q.shape[1], k_cache.shape[0]
    rows = []
    for b, n in enumerate(lens):
        pos = np.arange(n)
        slots = _t((tables[b, pos // _BLOCK] * _BLOCK + pos % _BLOCK).astype(np.int64))
        k = paddle.repeat_interleave(paddle.index_select(k_cache, slots, axis=1), nh // kvh, axis=0)
        v = paddle.repeat_interleave(paddle.index_select(v_cache, slots, axis=1), nh // kvh, axis=0)
        p = paddle.nn.functional.softmax(paddle.matmul(q[b].unsqueeze(1), k, transpose_y=True) * scale, axis=-1)
        rows.append(paddle.matmul(p, v).reshape([1, -1]))
    return paddle.concat(rows, axis=0)


def _decode_parts(ck, rng, isa: str) -> dict[str, tuple[float, float]]:
    """A ragged decode batch of 5 sequences over shuffled blocks, GQA 6 / 2, head_dim 32."""
    nh, kvh, d = 6, 2, 32
    lens = [1, _BLOCK, _BLOCK + 1, 2 * _BLOCK, 3 * _BLOCK - 1]
    per_seq = [-(-n // _BLOCK) for n in lens]
    num_blocks = sum(per_seq) + 3
    ids = rng.permutation(num_blocks)
    tables = np.zeros((len(lens), max(per_seq)), np.int32)
    start = 0
    for b, m in enumerate(per_seq):
        tables[b, :m] = ids[start:start + m]
        start += m
    k_cache = _t(random_array(rng, (kvh, num_blocks * _BLOCK, d)))
    v_cache = _t(random_array(rng, (kvh, num_blocks * _BLOCK, d)))
    q = _t(random_array(rng, (len(lens), nh, d)))
    scale = 1.0 / np.sqrt(d)
    parts = {}
    for kv_dtype in ("float32", "bfloat16", "float16"):  # the cache types the kernels read
        kc, vc = k_cache.astype(kv_dtype), v_cache.astype(kv_dtype)
        got = ck.paged_decode_attention(q, kc, vc, _t(tables), _t(np.asarray(lens, np.int32)), scale, _BLOCK, isa)
        ref = _decode_reference(q, kc.astype("float32"), vc.astype("float32"), tables, lens, scale)
        parts[f"paged_decode_attention ({kv_dtype} cache)"] = difference(got, ref)
    return parts


@register("cpu_kernels", build_id=_library_build)
def check_cpu_kernels(dtype: str, isa: str = "generic") -> tuple[float, float, str]:
    """The C++ CPU kernels on dispatch path `isa` ("avx512_vnni" | "avx2_fma" | "generic") against composed Paddle
    ops on the CPU. Raises ValueError for a dtype other than float32 (the kernels have no other) and
    whatever the library raises (not built, isa not supported by this CPU)."""
    if dtype != "float32":
        raise ValueError(f"the C++ CPU kernels are float32 only, not {dtype}")
    from paddle_llm_ops import cpu_kernels as ck

    ck.load()
    rng = np.random.default_rng(20261202)
    with paddle.no_grad():
        parts = {**_norm_parts(ck, rng, isa), **_swiglu_parts(ck, rng, isa), **_linear_parts(ck, rng, isa),
                 **_rotary_parts(ck, rng, isa),
                 **_decode_parts(ck, rng, isa)}
    return worst(parts)


@register("fused_rms_norm", isolate=True)
def check_fused_rms_norm(dtype: str) -> tuple[float, float, str]:
    """Paddle's fused_rms_norm (paddle.incubate) against the composed RMSNorm, in `dtype`, on a
    hidden size of SmolLM2 (576) and a per-head size (64)."""
    from paddle.incubate.nn.functional import fused_rms_norm

    rng = np.random.default_rng(20261203)
    parts = {}
    with paddle.no_grad():
        for rows, h in ((7, 576), (12, 64)):
            x = _t(random_array(rng, (rows, h))).astype(dtype)
            w = _t(random_array(rng, (h,))).astype(dtype)
            fused = fused_rms_norm(x, w, None, _EPS, 1)[0]
            xf = x.astype("float32")
            ref = _rms_composed(xf, paddle.ones([h], "float32"), _EPS).astype(dtype) * w
            parts[f"fused_rms_norm [{rows}, {h}]"] = difference(fused, ref)
    return worst(parts)
