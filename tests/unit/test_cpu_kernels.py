"""The C++ CPU kernels (paddle_llm_ops.cpu_kernels) against the composed Paddle ops and numpy, on
both dispatch paths: random inputs, ragged contexts, shuffled (non-contiguous) block tables.

Bounds: GEMV max |err| / max |ref| <= 1e-5 against paddle.matmul; attention max |err| <= 1e-5
against the composed decode_attention (values ~N(0, 1)); rotary + KV writes bit-identical to
apply_rotary + write_kv; RMSNorm <= 1e-5 relative; int8 GEMV bit-identical to a numpy model of the
same arithmetic and, against the fp32 weights, within the rounding bound
|y_int8 - y_fp32| <= sum_k |x_k| * scale_n / 2 (+ fp32 slack).
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_llm_ops.cpu_kernels as ck
from cpu_kernels_reference import gemv_int8_reference
from paddle_llm_ops.kv_cache import write_kv
from paddle_llm_ops.norm import rms_norm_composed as composed_rms_norm
from paddle_llm_ops.paged_attention import decode_attention
from paddle_llm_ops.rotary import RotaryTable, apply_rotary


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


HOST_AVX2_FMA = {"avx2", "fma"} <= _cpu_flags()
HOST_VNNI = HOST_AVX2_FMA and {"avx512f", "avx512bw", "avx512_vnni"} <= _cpu_flags()
# The ISAs this CPU runs: every kernel test runs on each of them. An ISA the CPU lacks cannot run
# here (SIGILL); what this host can check about it is that every op refuses it by name
# (test_an_isa_this_cpu_lacks_is_refused_by_name), and test_platform_plan decides for such hosts.
HOST_ISAS = {"generic": True, "avx2_fma": HOST_AVX2_FMA, "avx512_vnni": HOST_VNNI}
# every op runs its AVX2+FMA code on avx512_vnni too (only the int8 x int8 GEMV has VNNI code)
ISA_PARAMS = [pytest.param(isa, id=isa) for isa, ok in HOST_ISAS.items() if ok]


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    paddle.set_device("cpu")
    ck.load()  # KernelsNotBuiltError (run scripts/setup.sh) fails every test here, never skips
    yield
    ck.set_num_threads(0)


def t(a) -> paddle.Tensor:
    return paddle.to_tensor(np.ascontiguousarray(a))


def rel_err(got, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


# ------------------------------------------------------------------------------------ dispatch
def test_library_cpu_check_agrees_with_cpuinfo():
    assert ck.cpu_supports_avx2_fma() == HOST_AVX2_FMA
    assert ck.cpu_supports_avx512_vnni() == HOST_VNNI
    want = ("avx512_vnni", "avx2_fma", "generic") if HOST_VNNI else ("avx2_fma", "generic") if HOST_AVX2_FMA \
        else ("generic",)
    assert ck.supported_isas() == want


def test_isa_selection_is_validated():
    x = t(np.ones((1, 8), np.float32))
    with pytest.raises(ValueError, match="unknown isa"):
        ck.gemv(x, x, isa="sse9")


def test_an_isa_this_cpu_lacks_is_refused_by_name():
    """Each op with an isa argument: on an ISA this CPU has, it runs; on one it lacks, a ValueError
    naming the isa and what the CPU misses (the library checks CPUID before dispatching), never a
    SIGILL. On a host with every ISA, the first half is all there is to check."""
    rng = np.random.default_rng(3)
    x = t(rng.standard_normal((2, 64)).astype(np.float32))
    w = t(rng.standard_normal((8, 64)).astype(np.float32))
    q, s = ck.quantize_int4_numpy(rng.standard_normal((8, 64)).astype(np.float32), 64)
    q8 = t(rng.integers(-127, 128, (8, 64)).astype(np.int8))
    s8 = t(np.full(8, 0.01, np.float32))
    ops = {"gemv": lambda isa: ck.gemv(x, w, isa=isa),
           "gemv_int4": lambda isa: ck.gemv_int4(x, t(q), t(s), None, isa=isa),
           "gemv_w8a8": lambda isa: ck.gemv_w8a8(x, q8, s8, None, isa, 32)}
    for isa, ok in HOST_ISAS.items():
        for name, op in ops.items():
            if ok:
                assert list(op(isa).shape) == [2, 8], (name, isa)
            else:
                with pytest.raises(ValueError, match=f"isa '{isa}' requested but this CPU"):
                    op(isa)


def test_avx2_code_only_in_avx2_functions():
    """Every function of the library that contains a VEX (or EVEX) instruction is one of the
    target-attribute functions (AVX2, or AVX-512: names with "vnni" or "avx512"): the generic path
    and the op glue run on any x86-64."""
    import shutil
    import subprocess

    # binutils comes with the g++ that set-up builds the library with
    assert shutil.which("objdump") is not None, "objdump (binutils) is missing although g++ built the kernels"
    text = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(ck.library_path())],
                          capture_output=True, text=True, check=True).stdout
    vex_functions, fn = set(), None
    for line in text.splitlines():
        if line.endswith(">:") and " <" in line:
            fn = line.split(" <", 1)[1][:-2]
        elif fn and "\t" in line:
            parts = line.split("\t")
            if len(parts) > 1 and parts[1].startswith("v"):
                vex_functions.add(fn)
    assert vex_functions, "no AVX2 code found at all"
    simd = ("avx2", "vnni", "avx512")
    assert all(any(m in f for m in simd) for f in vex_functions), \
        sorted(f for f in vex_functions if not any(m in f for m in simd))


# ------------------------------------------------------------------------------------ GEMV fp32
GEMV_SHAPES = [(1, 960, 576), (1, 576, 1536), (3, 13, 67), (8, 3072, 576), (32, 576, 1536), (5, 7, 5), (2, 1, 9),
               (100, 33, 40)]


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("b,n,k", GEMV_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_paddle_matmul(isa, b, n, k, with_bias):
    rng = np.random.default_rng(b * 1000 + n + k)
    x = rng.standard_normal((b, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    xt, wt = t(x), t(w)
    ref = paddle.matmul(xt, wt, transpose_y=True)
    if with_bias:
        ref = ref + t(bias)
    got = ck.gemv(xt, wt, None if bias is None else t(bias), isa=isa)
    assert got.shape == [b, n]
    assert rel_err(got.numpy(), ref.numpy()) <= 1e-5


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_gemv_threads_do_not_change_results(isa):
    rng = np.random.default_rng(7)
    x = t(rng.standard_normal((4, 576)).astype(np.float32))
    w = t(rng.standard_normal((3072, 576)).astype(np.float32))  # 7 MB: runs on several threads
    ck.set_num_threads(1)
    one = ck.gemv(x, w, isa=isa).numpy()
    ck.set_num_threads(2)
    two = ck.gemv(x, w, isa=isa).numpy()
    ck.set_num_threads(0)
    assert np.array_equal(one, two)


@pytest.mark.skipif(not HOST_VNNI, reason="the fp32 GEMM is AVX-512 code; this CPU lacks it")
@pytest.mark.parametrize("b,n,k", [(1, 5, 3), (6, 32, 16), (7, 33, 17), (17, 960, 576), (64, 576, 1536), (23, 100, 40)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_f32_against_float64(b, n, k, with_bias):
    """The fp32 GEMM's tails (rows of a 6-row tile, a 32-channel panel, 16 input channels) within fp32
    rounding of a float64 product (one fused multiply-add chain per output: |err| <= K eps sum|x w|)."""
    rng = np.random.default_rng(b * 31 + n + k)
    x = rng.standard_normal((b, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    got = ck.gemm_f32(t(x), t(w), None if bias is None else t(bias)).numpy()
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if bias is None else bias)
    bound = (k + 1) * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w).T + (0 if bias is None else np.abs(bias)))
    assert got.shape == (b, n) and np.all(np.abs(got - ref) <= bound)
    if ck.GEMV_MAX_BATCH < b <= ck.F32_GEMM_MAX_ROWS:  # what `linear` runs at this row count here
        assert np.array_equal(ck.linear(t(x), t(w), None if bias is None else t(bias), "avx512_vnni").numpy(), got)


def test_gemm_f32_refuses_other_isas():
    with pytest.raises(ValueError, match="isa must be avx512_vnni"):
        ck.gemm_f32(t(np.ones((2, 8), np.float32)), t(np.ones((3, 8), np.float32)), isa="generic")


@pytest.mark.parametrize("b", [1, ck.GEMV_MAX_BATCH, ck.GEMV_MAX_BATCH + 1, ck.F32_GEMM_MAX_ROWS + 1, 300])
def test_linear_any_batch(b):
    rng = np.random.default_rng(b)
    x = t(rng.standard_normal((b, 96)).astype(np.float32))
    w = t(rng.standard_normal((40, 96)).astype(np.float32))
    bias = t(rng.standard_normal(40).astype(np.float32))
    ref = paddle.matmul(x, w, transpose_y=True) + bias
    assert rel_err(ck.linear(x, w, bias).numpy(), ref.numpy()) <= 1e-5
    q, s = ck.quantize_int8(w)
    ref8 = paddle.matmul(x, ck.dequantize_int8(q, s), transpose_y=True) + bias
    assert rel_err(ck.linear_int8(x, q, s, bias).numpy(), ref8.numpy()) <= 1e-5


def test_gemv_rejects_bad_inputs():
    x = t(np.ones((2, 8), np.float32))
    with pytest.raises(ValueError, match="K = x.shape"):
        ck.gemv(x, t(np.ones((3, 9), np.float32)))
    with pytest.raises(ValueError, match="dtype"):
        ck.gemv(x.astype("float64"), t(np.ones((3, 8), np.float32)))
    with pytest.raises(ValueError, match="bias"):
        ck.gemv(x, t(np.ones((3, 8), np.float32)), t(np.ones(4, np.float32)))


# ------------------------------------------------------------------------------------ int8
def test_quantize_int8_numpy_and_cpp_agree_bitwise():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((37, 75)).astype(np.float32)
    w[5] = 0.0                                         # all-zero row: scale 0, q 0
    w[6, :6] = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5]      # scale 1: ties round half to even
    w[6, 6:] = 0.0
    q_np, s_np = ck.quantize_int8_numpy(w)
    q_pd, s_pd = ck.quantize_int8(t(w))
    assert q_pd.dtype == paddle.int8 and s_pd.dtype == paddle.float32
    assert np.array_equal(q_pd.numpy(), q_np) and np.array_equal(s_pd.numpy(), s_np)
    assert s_np[5] == 0 and not q_np[5].any()
    assert s_np[6] == 1.0 and list(q_np[6, :6]) == [127, 0, 2, 2, 0, -2]
    assert np.abs(q_np).max() <= 127
    # every weight within half a step of its dequantized value
    assert np.all(np.abs(q_np * s_np[:, None] - w) <= s_np[:, None] / 2 * (1 + 1e-6))


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("b,n,k", [(1, 960, 576), (3, 13, 67), (8, 300, 576), (32, 64, 1536), (5, 7, 5)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_int8_exact_and_within_quantization_bound(isa, b, n, k, with_bias):
    rng = np.random.default_rng(b * 7 + n + k)
    x = rng.standard_normal((b, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    q, s = ck.quantize_int8_numpy(w)
    got = ck.gemv_int8(t(x), t(q), t(s), None if bias is None else t(bias), isa=isa).numpy()
    model = gemv_int8_reference(x, q, s, bias, fused=(isa != "generic"))
    assert np.array_equal(got, model), f"max diff {np.abs(got - model).max()}"
    # against fp32 weights: each weight is off by <= scale/2, so |dy| <= sum|x| * scale / 2
    exact = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if bias is None else bias)
    bound = np.abs(x).sum(axis=1, keepdims=True) * s[None, :] / 2
    slack = 1e-5 * (np.abs(x) @ np.abs(w).T + (0 if bias is None else np.abs(bias)))
    assert np.all(np.abs(got - exact) <= bound + slack)


# ------------------------------------------------------------------------------------ RMSNorm
@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("rows,h", [(1, 576), (7, 576), (300, 576), (5, 67), (4, 64)])
def test_rms_norm_matches_composed(isa, rows, h):
    rng = np.random.default_rng(rows + h)
    x = (rng.standard_normal((rows, h)) * 3).astype(np.float32)
    w = rng.standard_normal(h).astype(np.float32)
    r = rng.standard_normal((rows, h)).astype(np.float32)
    eps = 1e-5
    ref = composed_rms_norm(t(x), t(w), eps).numpy()
    got = ck.rms_norm(t(x), t(w), eps, isa=isa).numpy()
    assert rel_err(got, ref) <= 1e-5
    normed, total = ck.add_rms_norm(t(x), t(r), t(w), eps, isa=isa)
    s_ref = (t(x) + t(r)).numpy()
    assert np.array_equal(total.numpy(), s_ref)  # the residual sum is the same fp32 add
    assert rel_err(normed.numpy(), composed_rms_norm(t(s_ref), t(w), eps).numpy()) <= 1e-5


# ------------------------------------------------------------------------------ rotary + KV write
def _rotary_case(rng, t_tokens, nh, kvh, d, num_slots=700, max_pos=4096):
    qkv = rng.standard_normal((t_tokens, (nh + 2 * kvh) * d)).astype(np.float32)
    positions = rng.integers(0, max_pos, t_tokens).astype(np.int64)  # ragged: tokens of many sequences
    slots = rng.permutation(num_slots)[:t_tokens].astype(np.int64)   # scattered, non-contiguous
    k_cache = rng.standard_normal((kvh, num_slots, d)).astype(np.float32)
    v_cache = rng.standard_normal((kvh, num_slots, d)).astype(np.float32)
    return qkv, positions, slots, k_cache, v_cache


def _composed_rotary_kv(qkv, positions, slots, k_cache, v_cache, table, nh, kvh, d, q_norm=None, k_norm=None, eps=1e-6):
    tq = qkv.shape[0]
    q, k, v = paddle.split(t(qkv), [nh * d, kvh * d, kvh * d], axis=-1)
    if q_norm is not None:
        q = composed_rms_norm(q.reshape([tq * nh, d]), t(q_norm), eps)
        k = composed_rms_norm(k.reshape([tq * kvh, d]), t(k_norm), eps)
    cos, sin = table.lookup(t(positions))
    q = apply_rotary(q.reshape([tq, nh, d]), cos, sin)
    k = apply_rotary(k.reshape([tq, kvh, d]), cos, sin)
    kc, vc = t(k_cache), t(v_cache)
    write_kv(kc, vc, k, v.reshape([tq, kvh, d]), t(slots))
    return q.numpy(), kc.numpy(), vc.numpy()


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("tokens,nh,kvh,d", [(1, 9, 3, 64), (32, 9, 3, 64), (300, 9, 3, 64), (5, 2, 2, 16),
                                             (6, 4, 2, 12), (3, 16, 2, 128)])
def test_rotary_kv_write_bit_identical_to_composed(isa, tokens, nh, kvh, d):
    rng = np.random.default_rng(tokens * 31 + d)
    table = RotaryTable(d, 4096, 100000.0)
    qkv, positions, slots, k_cache, v_cache = _rotary_case(rng, tokens, nh, kvh, d)
    q_ref, kc_ref, vc_ref = _composed_rotary_kv(qkv, positions, slots, k_cache, v_cache, table, nh, kvh, d)
    kc, vc = t(k_cache), t(v_cache)
    q = ck.rotary_kv_write(t(qkv), t(positions), table.cos, table.sin, kc, vc, t(slots), nh, kvh, isa=isa)
    assert q.shape == [tokens, nh, d]
    assert np.array_equal(q.numpy(), q_ref)
    assert np.array_equal(kc.numpy(), kc_ref)  # rotated k in its slots, every other slot untouched
    assert np.array_equal(vc.numpy(), vc_ref)


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_rotary_kv_write_with_qk_norm(isa):
    rng = np.random.default_rng(11)
    nh, kvh, d = 8, 2, 64
    table = RotaryTable(d, 4096, 1e6, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})
    qkv, positions, slots, k_cache, v_cache = _rotary_case(rng, 9, nh, kvh, d)
    qn, kn = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    q_ref, kc_ref, vc_ref = _composed_rotary_kv(qkv, positions, slots, k_cache, v_cache, table, nh, kvh, d, qn, kn)
    kc, vc = t(k_cache), t(v_cache)
    q = ck.rotary_kv_write(t(qkv), t(positions), table.cos, table.sin, kc, vc, t(slots), nh, kvh, t(qn), t(kn),
                           eps=1e-6, isa=isa)
    assert rel_err(q.numpy(), q_ref) <= 1e-5
    assert rel_err(kc.numpy(), kc_ref) <= 1e-5
    assert np.array_equal(vc.numpy(), vc_ref)


def test_rotary_kv_write_rejects_out_of_range_before_writing():
    rng = np.random.default_rng(5)
    table = RotaryTable(16, 64, 10000.0)
    qkv, positions, slots, k_cache, v_cache = _rotary_case(rng, 4, 2, 1, 16, num_slots=32, max_pos=64)
    kc, vc = t(k_cache), t(v_cache)
    bad = slots.copy()
    bad[-1] = 32
    with pytest.raises(ValueError, match="slot_mapping"):
        ck.rotary_kv_write(t(qkv), t(positions), table.cos, table.sin, kc, vc, t(bad), 2, 1)
    assert np.array_equal(kc.numpy(), k_cache) and np.array_equal(vc.numpy(), v_cache)
    badp = positions.copy()
    badp[0] = 64
    with pytest.raises(ValueError, match="positions"):
        ck.rotary_kv_write(t(qkv), t(badp), table.cos, table.sin, kc, vc, t(slots), 2, 1)


# ----------------------------------------------------------------------------- decode attention
def _paged_case(rng, ctx_lens, kvh, d, block_size, spare_blocks=5):
    """Caches with every sequence's blocks at shuffled block ids; returns (k, v, block_tables,
    per-sequence slot lists)."""
    need = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(need) + spare_blocks
    ids = rng.permutation(num_blocks)
    max_blocks = max(need + [1]) + 2  # wider than any sequence needs: the tail is never read
    tables = np.full((len(ctx_lens), max_blocks), -1, np.int32)  # -1 past the end: must be ignored
    slots, used = [], 0
    for i, (c, n) in enumerate(zip(ctx_lens, need)):
        tables[i, :n] = ids[used:used + n]
        used += n
        pos = np.arange(c)
        slots.append(tables[i, pos // block_size].astype(np.int64) * block_size + pos % block_size)
    k_cache = rng.standard_normal((kvh, num_blocks * block_size, d)).astype(np.float32)
    v_cache = rng.standard_normal((kvh, num_blocks * block_size, d)).astype(np.float32)
    return k_cache, v_cache, tables, slots


def _composed_decode(q, k_cache, v_cache, slots, scale):
    width = max(len(s) for s in slots)
    dslots = np.zeros((len(slots), width), np.int64)
    mask = np.full((1, len(slots), 1, width), -np.inf, np.float32)
    for i, s in enumerate(slots):
        dslots[i, :len(s)] = s
        mask[0, i, 0, :len(s)] = 0
    return decode_attention(t(q), t(k_cache), t(v_cache), t(dslots), t(mask), scale).numpy()


def _numpy_decode(q, k_cache, v_cache, slots, scale):
    b, nh, d = q.shape
    kvh = k_cache.shape[0]
    out = np.zeros((b, nh, d))
    for i, s in enumerate(slots):
        for h in range(nh):
            g = h // (nh // kvh)
            sc = k_cache[g, s].astype(np.float64) @ q[i, h].astype(np.float64) * scale
            p = np.exp(sc - sc.max())
            out[i, h] = (p / p.sum()) @ v_cache[g, s].astype(np.float64)
    return out.reshape(b, nh * d)


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("ctx,nh,kvh,d,bs", [
    ([1], 9, 3, 64, 64),
    ([1500], 9, 3, 64, 64),                     # one long context: split into chunks over threads
    ([1, 63, 64, 65, 700, 130, 5], 9, 3, 64, 64),  # ragged batch
    ([17, 33, 300], 9, 3, 64, 16),
    ([40, 80], 4, 4, 128, 32),                 # MHA, d 128
    ([50, 9, 1200], 16, 2, 64, 64),            # 8 query heads per KV head
    ([23, 7], 6, 3, 12, 8),                    # d 12: generic kernel under avx2_fma too
    ([100] * 32, 9, 3, 64, 64),                # decode batch 32
])
def test_paged_decode_attention_matches_composed(isa, ctx, nh, kvh, d, bs):
    rng = np.random.default_rng(sum(ctx) + nh + d + bs)
    k_cache, v_cache, tables, slots = _paged_case(rng, ctx, kvh, d, bs)
    q = rng.standard_normal((len(ctx), nh, d)).astype(np.float32)
    scale = d ** -0.5
    got = ck.paged_decode_attention(t(q), t(k_cache), t(v_cache), t(tables), t(np.asarray(ctx, np.int32)), scale, bs,
                                    isa=isa).numpy()
    ref = _composed_decode(q, k_cache, v_cache, slots, scale)
    assert got.shape == ref.shape == (len(ctx), nh * d)
    assert np.abs(got - ref).max() <= 1e-5
    assert np.abs(got - _numpy_decode(q, k_cache, v_cache, slots, scale)).max() <= 1e-5


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_paged_decode_attention_large_scores_stable(isa):
    """Scores in the hundreds (peaked softmax) stay finite and match a float64 reference."""
    rng = np.random.default_rng(2)
    ctx = [300, 77]
    k_cache, v_cache, tables, slots = _paged_case(rng, ctx, 3, 64, 64)
    q = (rng.standard_normal((2, 9, 64)) * 60).astype(np.float32)
    got = ck.paged_decode_attention(t(q), t(k_cache), t(v_cache), t(tables), t(np.asarray(ctx, np.int32)), 0.125,
                                    64, isa=isa).numpy()
    assert np.isfinite(got).all()
    assert np.abs(got - _numpy_decode(q, k_cache, v_cache, slots, 0.125)).max() <= 1e-4


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_paged_decode_attention_threads_and_empty_context(isa):
    rng = np.random.default_rng(9)
    ctx = [2000, 0, 3]
    k_cache, v_cache, tables, slots = _paged_case(rng, ctx, 3, 64, 64)
    q = rng.standard_normal((3, 9, 64)).astype(np.float32)
    args = (t(q), t(k_cache), t(v_cache), t(tables), t(np.asarray(ctx, np.int32)), 0.125, 64)
    ck.set_num_threads(1)
    one = ck.paged_decode_attention(*args, isa=isa).numpy()
    ck.set_num_threads(2)
    two = ck.paged_decode_attention(*args, isa=isa).numpy()
    ck.set_num_threads(0)
    assert not one[1].any()  # context 0: a zero row
    ref = _numpy_decode(q[[0, 2]], k_cache, v_cache, [slots[0], slots[2]], 0.125)
    assert np.abs(one[[0, 2]] - ref).max() <= 1e-5 and np.abs(two[[0, 2]] - ref).max() <= 1e-5


def test_paged_decode_attention_on_a_slice_of_the_rotary_output():
    """q may be the first rows of rotary_kv_write's output (decodes come first in a step)."""
    rng = np.random.default_rng(4)
    ctx = [10, 20]
    k_cache, v_cache, tables, slots = _paged_case(rng, ctx, 3, 64, 16)
    q_all = t(rng.standard_normal((5, 9, 64)).astype(np.float32))
    got = ck.paged_decode_attention(q_all[:2], t(k_cache), t(v_cache), t(tables), t(np.asarray(ctx, np.int32)),
                                    0.125, 16).numpy()
    ref = _numpy_decode(q_all.numpy()[:2], k_cache, v_cache, slots, 0.125)
    assert np.abs(got - ref).max() <= 1e-5


def test_paged_decode_attention_rejects_bad_block_ids():
    rng = np.random.default_rng(1)
    k_cache, v_cache, tables, _ = _paged_case(rng, [40], 3, 64, 16)
    tables[0, 1] = k_cache.shape[1] // 16
    q = t(rng.standard_normal((1, 9, 64)).astype(np.float32))
    with pytest.raises(ValueError, match="block_tables"):
        ck.paged_decode_attention(q, t(k_cache), t(v_cache), t(tables), t(np.asarray([40], np.int32)), 0.125, 16)
    with pytest.raises(ValueError, match="context_lens"):
        ck.paged_decode_attention(q, t(k_cache), t(v_cache), t(tables),
                                  t(np.asarray([16 * tables.shape[1] + 1], np.int32)), 0.125, 16)
