"""C++ CPU kernels for the decode step (Paddle custom ops, CPU place, fp32 activations).

Built once at set-up (`scripts/setup.sh` runs `build.py`, cached by source hash under
`build/cpu_kernels/`); this module only loads the built library. The composed Paddle ops of
`paddle_llm_ops` stay the reference and the fallback: nothing here changes them.

Dispatch: every op runs either its AVX2+FMA code or its portable C++ code, chosen by the `isa`
argument ("avx512_vnni" | "avx2_fma" | "generic"; default "generic"). "avx512_vnni" runs the int8 x
int8 GEMV (gemv_w8a8) on AVX-512 VNNI and every other op on its AVX2+FMA code. The caller (the
platform layer) decides from the CPU's flags; the library additionally refuses an isa the CPU's
cpuid lacks (the op raises), so an instruction the CPU lacks is never executed.

Threads: only large ops (GEMV over big weights, attention over long contexts, long prefill rows)
open an OpenMP region, on the OpenMP runtime the paddle wheel already uses (libiomp5: one team
shared with MKL); small ops run on the calling thread. `set_num_threads` sets the count (default:
the CPUs of the process's affinity mask).

Errors: ops raise ValueError (Paddle's wrapped C++ error text) for a wrong dtype, shape, place, a
non-contiguous tensor or an index outside the cache / rotary table; `load()` raises
KernelsNotBuiltError when the library for the current sources is missing.

Ops (all fp32 unless stated; B = decode batch, T = tokens of a step):
  gemv / linear             x [B, K] . w [N, K]^T (+ bias [N])                       -> [B, N]
  gemv_int8 / linear_int8   (x [B, K] . q [N, K]^T) * scale [N] (+ bias)  (q int8)   -> [B, N]
  quantize_int8             w [N, K] -> (q [N, K] int8, scale [N])
  gemv_w8a8 / linear_w8a8   the same weights, x quantized to int8 in the call (per row and group
                            of `group` input channels; wint8: 32), int8 x int8 dot products with
                            int32 sums                                            -> [B, N]
  quantize_activations_int8 x [B, K] -> (xq [B, K] int8, xs [B, groups]) (the kernel's own step)
  int8_dot_groups           xq [B, K] int8 . q [N, K]^T per group -> int32 [B, N, groups] (tests)
  gemv_int4 / linear_int4   x [B, K] . (q * scale)^T (+ bias)  (q [N, K/2] packed int4,
                            scale [N, K / group] fp32)                            -> [B, N]
  dequantize_int4           (q, scale, K) -> the fp32 [N, K] weight gemv_int4 multiplies by
  rms_norm                  x [T, H], weight [H], eps                                -> [T, H]
  add_rms_norm              x, residual [T, H], weight [H], eps      -> (normed [T, H], x + residual)
  rotary_kv_write           qkv [T, (nh + 2 kvh) d] -> q [T, nh, d]; writes k, v into the caches
  paged_decode_attention    q [B, nh, d] over block tables            -> [B, nh * d]
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_ops.cpu_kernels import build as _build

ISAS = ("avx512_vnni", "avx2_fma", "generic")
# The isas on which Int8Linear quantizes activations (gemv_w8a8) by default; on "generic" it keeps the
# weight-only int8 GEMV (more accurate; plain C++ int8 dot products are not measured to be faster).
W8A8_ISAS = ("avx512_vnni", "avx2_fma")
# Activation group for gemv_w8a8 in Int8Linear: one fp32 scale per 32 input channels of each row
# of x, llama.cpp's Q8_0 block. Measured on SmolLM2 (tests/model/test_wint8.py's prompts): one
# scale per row moved the prefill logits 1.15 from the weight-only int8 path and kept 1 of 8 prompts
# greedy-identical to fp32 over 24 tokens (the test needs 4); groups of 32: 0.38 and 4 of 8, the
# weight-only path's own figures. Groups of 32 run the lane paths of csrc/gemv_w8a8.cc.
W8A8_GROUP = 32

# Batches up to this size use our GEMV in `linear`; larger ones (prefill) use paddle.matmul on the
# same [N, K] weight with transpose_y=True (MKL). Host-dependent (benchmarks/bench_kernels.py
# --only crossover): on the AVX-512 Xeon this was written on, MKL's AVX-512 kernels overtake our
# AVX2 GEMV between 8 and 24 rows (cold weights).
GEMV_MAX_BATCH = 16
# int8: above this batch the weight is dequantized to a temporary fp32 [N, K] and multiplied by
# paddle.matmul (the temporary lives for one call only; the model keeps the int8 copy alone).
# Dequantizing costs a full pass over the weight, so our int8 GEMV stays ahead much longer.
GEMV_INT8_MAX_BATCH = 64
# int4: the same rule (the GEMV dequantizes a few rows at a time into L1 for any batch).
GEMV_INT4_MAX_BATCH = 64


class KernelsNotBuiltError(RuntimeError):
    """The built library for the current kernel sources is missing (run scripts/setup.sh)."""


_lock = threading.Lock()
_loaded_path: Path | None = None
_cdll: ctypes.CDLL | None = None


def library_path() -> Path:
    """Path of the library built for the current sources (it may not exist)."""
    return _build.library_path()


def load() -> Path:
    """Load the built library and register its ops with Paddle (idempotent). Returns its path.
    Raises KernelsNotBuiltError naming the expected path when it was not built."""
    global _loaded_path, _cdll
    if _loaded_path is not None:
        return _loaded_path
    with _lock:
        if _loaded_path is not None:
            return _loaded_path
        path = library_path()
        if not path.is_file():
            raise KernelsNotBuiltError(
                f"the C++ CPU kernels are not built for the current sources (expected {path}): run scripts/setup.sh "
                f"(or `python ops/paddle_llm_ops/cpu_kernels/build.py`)")
        from paddle.utils.cpp_extension import load_op_meta_info_and_register_op

        load_op_meta_info_and_register_op(str(path))
        _cdll = ctypes.CDLL(str(path))  # the same handle: reaches the library's C entry points
        _cdll.plk_set_num_threads.argtypes = [ctypes.c_int]
        _loaded_path = path
        return path


def c_library() -> ctypes.CDLL:
    """The loaded library's C entry points (ctypes; calls through it release the GIL). Loads it first."""
    load()
    return _cdll


def available() -> bool:
    """True when the library for the current sources is built and loads (never raises)."""
    try:
        load()
        return True
    except Exception:
        return False


def cpu_supports_avx2_fma() -> bool:
    """The library's own check (cpuid + OS state, GCC __builtin_cpu_supports). Needs the library."""
    load()
    return bool(_cdll.plk_cpu_has_avx2_fma())


def cpu_supports_avx512_vnni() -> bool:
    """The library's own check for AVX-512 F/BW/VNNI plus AVX2+FMA (cpuid + OS state). Needs the library."""
    load()
    return bool(_cdll.plk_cpu_has_avx512_vnni())


def supported_isas() -> tuple[str, ...]:
    """The isas this CPU can run, best first."""
    if not cpu_supports_avx2_fma():
        return ("generic",)
    return ISAS if cpu_supports_avx512_vnni() else ("avx2_fma", "generic")


def set_num_threads(n: int) -> None:
    """Threads the kernels may use (n >= 1); n <= 0 restores the default (CPUs in the affinity mask)."""
    load()
    _cdll.plk_set_num_threads(int(n))


def get_num_threads() -> int:
    """The thread count the kernels use now."""
    load()
    return int(_cdll.plk_num_threads())


def _run(op: str, *args):
    load()
    try:
        return paddle._C_ops._run_custom_op(op, *args)
    except OSError as e:  # Paddle surfaces a custom op's PD_CHECK / PD_THROW as OSError
        raise ValueError(f"{op}: {e}") from None


def _resolve(isa: str) -> str:
    if isa not in ISAS:
        raise ValueError(f"unknown isa {isa!r} (expected one of {', '.join(ISAS)})")
    return isa


# ------------------------------------------------------------------------------------ GEMV
def gemv(x: paddle.Tensor, w: paddle.Tensor, bias: paddle.Tensor | None = None,
         isa: str = "generic") -> paddle.Tensor:
    """y = x @ w^T (+ bias), streaming the weight once per call.

    x: [B, K] fp32 contiguous; w: [N, K] fp32 contiguous (the HF Linear layout "out, in", and the
    layout of a tied embedding); bias: [N] fp32 or None. Returns [B, N] fp32. Any B works; it is
    fastest for decode batches (B <= GEMV_MAX_BATCH; see `linear`). Summation order per output:
    8 lanes over k mod 8, then a fixed lane tree (csrc/gemv.cc), identical on both isas except that
    avx2_fma fuses multiply-add. Raises ValueError on wrong dtypes/shapes/places."""
    return _run("plk_gemv", x, w, bias, _resolve(isa))[0]


def linear(x: paddle.Tensor, w: paddle.Tensor, bias: paddle.Tensor | None = None,
           isa: str = "generic") -> paddle.Tensor:
    """x [B, K] @ w [N, K]^T (+ bias [N]) -> [B, N]: `gemv` for B <= GEMV_MAX_BATCH, else
    paddle.matmul(x, w, transpose_y=True) on the same weight (no second copy)."""
    if x.shape[0] <= GEMV_MAX_BATCH:
        return gemv(x, w, bias, isa)
    y = paddle.matmul(x, w, transpose_y=True)
    return y if bias is None else y + bias


def gemv_int8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
              isa: str = "generic") -> paddle.Tensor:
    """Weight-only int8: y[b, n] = (sum_k x[b, k] * q[n, k]) * scale[n] (+ bias[n]).

    x: [B, K] fp32; q: [N, K] int8 (from quantize_int8); scale: [N] fp32; bias: [N] fp32 or None.
    Returns [B, N] fp32. The sum uses the fixed order of `gemv` (the unit tests reproduce it
    exactly in numpy). Raises ValueError on wrong dtypes/shapes/places."""
    return _run("plk_gemv_int8", x, q, scale, bias, _resolve(isa))[0]


def linear_int8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
                isa: str = "generic") -> paddle.Tensor:
    """`gemv_int8` for B <= GEMV_INT8_MAX_BATCH; above, x @ dequantize_int8(q, scale)^T with
    paddle.matmul (a temporary fp32 weight for the duration of the call)."""
    if x.shape[0] <= GEMV_INT8_MAX_BATCH:
        return gemv_int8(x, q, scale, bias, isa)
    y = paddle.matmul(x, dequantize_int8(q, scale), transpose_y=True)
    return y if bias is None else y + bias


def gemv_w8a8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
              isa: str = "generic", group: int = 0) -> paddle.Tensor:
    """int8 weights x dynamically quantized int8 activations (llama.cpp's Q8_0 x Q8_0 scheme,
    ggml_vec_dot_q8_0_q8_0, with a per-output-channel weight scale):

        xs[b, g] = max |x[b, group g]| / 127,  xq = clamp(round-half-even(x / xs), -127, 127)
        acc[b, n, g] = sum_{k in g} xq[b, k] * q[n, k]            (exact int32)
        y[b, n] = (sum_g xs[b, g] * acc[b, n, g]) * scale[n] (+ bias[n])

    x: [B, K] fp32; q: [N, K] int8 in [-127, 127] and scale: [N] fp32 (from quantize_int8); bias:
    [N] fp32 or None; group: input channels per activation scale, 0 (or >= K) = one per row, else a
    multiple of 32 (at most 65536). Returns [B, N] fp32, bit-identical on every isa ("avx512_vnni":
    vpdpbusd; "avx2_fma": vpmaddubsw on |q| and sign(q) * xq; "generic": C++ int loops; see
    csrc/gemv_w8a8.cc) and to w8a8_reference_numpy. Error against gemv_int8 (fp32 activations):
    at most sum_k |x - xq * xs| |q| scale <= (xs / 2) * sum_k |q[n, k]| * scale[n] per output.
    Raises ValueError on wrong dtypes/shapes/places, a bad group or an isa the CPU lacks."""
    return _run("plk_gemv_w8a8", x, q, scale, bias, int(group), _resolve(isa))[0]


def linear_w8a8(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
                isa: str = "generic", group: int = 0) -> paddle.Tensor:
    """`gemv_w8a8` for B <= GEMV_INT8_MAX_BATCH; above, x @ dequantize_int8(q, scale)^T with
    paddle.matmul on fp32 activations (as linear_int8: prefill keeps fp32 activations)."""
    if x.shape[0] <= GEMV_INT8_MAX_BATCH:
        return gemv_w8a8(x, q, scale, bias, isa, group)
    y = paddle.matmul(x, dequantize_int8(q, scale), transpose_y=True)
    return y if bias is None else y + bias


def swiglu(x: paddle.Tensor, isa: str = "generic") -> paddle.Tensor:
    """SwiGLU of a fused gate_up output: x [B, 2I] fp32 (gate columns first) -> silu(x[:, :I]) * x[:, I:]
    [B, I] fp32, silu(g) = g / (1 + exp(-g)) (Shazeer 2020). avx2_fma / avx512_vnni evaluate exp with
    a polynomial (Cephes expf, within 2 ulp of it), generic with std::exp: the engine's op-by-op path
    and its decode stack call the same code, so both give the same bits. Raises ValueError on a wrong
    dtype, rank or an odd width."""
    return _run("plk_swiglu", x, _resolve(isa))[0]


def quantize_activations_int8(x: paddle.Tensor, group: int = 0) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The activation step of gemv_w8a8, as its own op: x [B, K] fp32 -> (xq [B, K] int8,
    xs [B, groups] fp32), groups = ceil(K / group) (1 for group 0). Raises ValueError as gemv_w8a8."""
    xq, xs = _run("plk_quantize_act_int8", x, int(group))
    return xq, xs


def int8_dot_groups(xq: paddle.Tensor, q: paddle.Tensor, group: int = 0, isa: str = "generic") -> paddle.Tensor:
    """The integer core of gemv_w8a8: acc[b, n, g] = sum_{k in group g} xq[b, k] * q[n, k] as int32
    [B, N, groups]. xq: [B, K] int8, q: [N, K] int8, both in [-127, 127] (ValueError otherwise:
    the AVX2 path's sign trick needs it). Exact on every isa (for tests and the kernel check)."""
    return _run("plk_int8_dot_groups", xq, q, int(group), _resolve(isa))[0]


def quantize_activations_numpy(x: np.ndarray, group: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """numpy version of quantize_activations_int8 (same bits): per row b and group g of `group`
    input channels (0: the whole row), xs = max |x| / 127 (fp32), xq = clip(rint(x / xs), -127, 127)
    (fp32 division; an all-zero group gets xs 0 and xq 0)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    b, k = x.shape
    g = k if group <= 0 or group >= k else int(group)
    groups = -(-k // g)
    xq = np.zeros((b, k), np.int8)
    xs = np.zeros((b, groups), np.float32)
    for j in range(groups):
        part = x[:, j * g:(j + 1) * g]
        s = (np.abs(part).max(axis=1) / np.float32(127)).astype(np.float32)
        safe = np.where(s > 0, s, np.float32(1))[:, None]
        qj = np.clip(np.rint(part / safe), -127, 127).astype(np.int8)
        qj[s == 0] = 0
        xq[:, j * g:(j + 1) * g], xs[:, j] = qj, s
    return xq, xs


def w8a8_reference_numpy(x: np.ndarray, q: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None,
                         group: int = 0) -> np.ndarray:
    """gemv_w8a8's result computed in numpy (int64 sums, then the kernel's fp32 epilogue in its order);
    bit-identical to the kernel on every isa."""
    xq, xs = quantize_activations_numpy(x, group)
    k = x.shape[1]
    g = k if group <= 0 or group >= k else int(group)
    v = np.zeros((x.shape[0], q.shape[0]), np.float32)
    for j in range(xs.shape[1]):
        acc = xq[:, j * g:(j + 1) * g].astype(np.int64) @ q[:, j * g:(j + 1) * g].astype(np.int64).T
        v = (v + xs[:, j:j + 1] * acc.astype(np.float32)).astype(np.float32)
    y = (v * scale[None, :].astype(np.float32)).astype(np.float32)
    return y if bias is None else (y + bias.astype(np.float32)).astype(np.float32)


def quantize_int4_numpy(w: np.ndarray, group_size: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 of an fp32 [N, K] weight (rows = output channels), one scale per group of
    group_size consecutive k of a row (-1: one group per row, i.e. per output channel).

    scale[n, g] = max |w[n, g*G:(g+1)*G]| / 7 (fp32), q = round-half-even(w / scale) clipped to
    [-7, 7] (fp32 division; an all-zero group gets scale 0 and q 0). Packed two per byte, k even in
    the low nibble, two's complement: q_packed [N, ceil(K / 2)] uint8. Returns (q_packed, scale
    fp32 [N, K / G]). Rounding error per weight <= scale / 2. Raises ValueError when group_size is
    not -1 or a positive multiple of 8 dividing K (the GEMV reads 8 weights per scale)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_int4 needs a 2-D [N, K] weight, got shape {w.shape}")
    n, k = w.shape
    g = k if group_size == -1 else int(group_size)
    if g <= 0 or k % g or (g != k and g % 8):
        raise ValueError(f"group_size {group_size} must be -1 or a positive multiple of 8 dividing K = {k}")
    groups = w.reshape(n, k // g, g)
    scale = (np.abs(groups).max(axis=2) / np.float32(7)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))[:, :, None]
    q = np.clip(np.rint(groups / safe), -7, 7).astype(np.int8)
    q[scale == 0] = 0
    q = q.reshape(n, k)
    if k % 2:
        q = np.concatenate([q, np.zeros((n, 1), np.int8)], axis=1)
    nib = q.view(np.uint8) & np.uint8(0x0F)
    return np.ascontiguousarray(nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4))), scale


def gemv_int4(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
              isa: str = "generic") -> paddle.Tensor:
    """Weight-only int4: y[b, n] = sum_k x[b, k] * (q[n, k] * scale[n, k // G]) (+ bias[n]).

    x: [B, K] fp32; q: [N, ceil(K/2)] uint8 and scale: [N, K / G] fp32 from quantize_int4_numpy;
    bias: [N] fp32 or None. Returns [B, N] fp32, bit-identical to `gemv(x, dequantize_int4(q, scale,
    K))` on the same isa (each weight is dequantized to fp32, then summed in gemv's fixed order).
    Raises ValueError on wrong dtypes/shapes/places or a group size the kernel cannot read."""
    return _run("plk_gemv_int4", x, q, scale, bias, _resolve(isa))[0]


def dequantize_int4(q: paddle.Tensor, scale: paddle.Tensor, k: int, isa: str = "generic") -> paddle.Tensor:
    """q [N, ceil(k/2)] uint8, scale [N, groups] -> the fp32 [N, k] weight gemv_int4 multiplies by."""
    return _run("plk_dequantize_int4", q, scale, int(k), _resolve(isa))[0]


def linear_int4(x: paddle.Tensor, q: paddle.Tensor, scale: paddle.Tensor, bias: paddle.Tensor | None = None,
                isa: str = "generic") -> paddle.Tensor:
    """`gemv_int4` for B <= GEMV_INT4_MAX_BATCH; above, x @ dequantize_int4(q, scale)^T with
    paddle.matmul (a temporary fp32 weight for the duration of the call)."""
    if x.shape[0] <= GEMV_INT4_MAX_BATCH:
        return gemv_int4(x, q, scale, bias, isa)
    y = paddle.matmul(x, dequantize_int4(q, scale, x.shape[1], isa), transpose_y=True)
    return y if bias is None else y + bias


def quantize_int8_numpy(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-output-channel symmetric int8 of an fp32 [N, K] weight (rows = output channels):
    scale[n] = max_k |w[n, k]| / 127 (fp32), q = round-half-even(w / scale) clipped to [-127, 127]
    (fp32 division); an all-zero row gets scale 0 and q 0. Returns (q int8 [N, K], scale fp32 [N]).
    Bit-identical to the C++ `quantize_int8`. Rounding error per weight <= scale / 2."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_int8 needs a 2-D [N, K] weight, got shape {w.shape}")
    scale = (np.abs(w).max(axis=1) / np.float32(127)).astype(np.float32)
    q = np.empty(w.shape, dtype=np.int8)
    safe = np.where(scale > 0, scale, np.float32(1))[:, None]
    step = max(1, (1 << 24) // max(1, w.shape[1]))  # rows per chunk: bounded temporaries
    for i in range(0, w.shape[0], step):
        r = np.rint(w[i:i + step] / safe[i:i + step])
        q[i:i + step] = np.clip(r, -127, 127).astype(np.int8)
    q[scale == 0] = 0
    return q, scale


def quantize_int8(w) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Quantize an fp32 [N, K] weight (paddle.Tensor or numpy array) for gemv_int8.
    Returns (q [N, K] int8, scale [N] fp32) as CPU tensors; see quantize_int8_numpy for the math.
    A paddle.Tensor runs the C++ op (threaded), numpy the numpy version; both give the same bits."""
    if isinstance(w, np.ndarray):
        q, s = quantize_int8_numpy(w)
        return from_numpy(q), from_numpy(s)
    q, s = _run("plk_quantize_int8", w)
    return q, s


def dequantize_int8(q: paddle.Tensor, scale: paddle.Tensor) -> paddle.Tensor:
    """q [N, K] int8, scale [N] -> q * scale[:, None] as fp32 [N, K] (composed Paddle ops)."""
    return q.astype("float32") * scale.unsqueeze(1)


# --------------------------------------------------------------------------------- RMSNorm
def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float, isa: str = "generic") -> paddle.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight. x: [T, H] fp32, weight: [H]. Returns [T, H].
    Also serves per-head norms (Qwen3 q/k norm) with x reshaped to [T * heads, head_dim]."""
    return _run("plk_rms_norm", x, weight, float(eps), _resolve(isa))[0]


def add_rms_norm(x: paddle.Tensor, residual: paddle.Tensor, weight: paddle.Tensor, eps: float,
                 isa: str = "generic") -> tuple[paddle.Tensor, paddle.Tensor]:
    """s = x + residual; returns (rms_norm(s, weight, eps), s), both [T, H] fp32, in one pass.
    Replaces `h = h + delta; x = rms_norm(h, w, eps)` of the decoder (s is the new residual h)."""
    y, s = _run("plk_add_rms_norm", x, residual, weight, float(eps), _resolve(isa))
    return y, s


# ------------------------------------------------------------------------ rotary + KV write
def rotary_kv_write(qkv: paddle.Tensor, positions: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor,
                    k_cache: paddle.Tensor, v_cache: paddle.Tensor, slot_mapping: paddle.Tensor, num_heads: int,
                    num_kv_heads: int, q_norm: paddle.Tensor | None = None, k_norm: paddle.Tensor | None = None,
                    eps: float = 1e-6, isa: str = "generic") -> paddle.Tensor:
    """Rotary embedding (rotate-half) of q and k plus the paged KV write, in one pass, no concat.

    qkv: [T, (num_heads + 2 * num_kv_heads) * d] fp32, the fused projection output (q heads, then
    k heads, then v heads); positions: [T] int64; cos, sin: [max_positions, d] fp32 as
    RotaryTable.cos / .sin build them; k_cache, v_cache: [num_kv_heads, num_slots, d] fp32, written
    in place at slot_mapping [T] int64 (rotated k, v bit-copied); q_norm, k_norm: optional [d] fp32
    per-head RMSNorm weights applied before the rotation (Qwen3), both or neither, with eps.
    Returns the rotated q [T, num_heads, d]. Without q/k norms, q and the cache rows are
    bit-identical to apply_rotary + write_kv. Raises ValueError for a position outside the table or
    a slot outside the cache (checked before anything is written). Duplicate slots: the last token
    wins."""
    out = _run("plk_rotary_kv", qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, q_norm, k_norm,
               int(num_heads), int(num_kv_heads), float(eps), _resolve(isa))
    return out[0]


# --------------------------------------------------------------------- paged decode attention
def paged_decode_attention(q: paddle.Tensor, k_cache: paddle.Tensor, v_cache: paddle.Tensor,
                           block_tables: paddle.Tensor, context_lens: paddle.Tensor, scale: float, block_size: int,
                           isa: str = "generic") -> paddle.Tensor:
    """Decode attention reading K/V straight from each sequence's blocks.

    q: [B, num_heads, d] fp32 (one new token per sequence, already rotated and its k/v already in
    the cache); k_cache, v_cache: [num_kv_heads, num_blocks * block_size, d] fp32;
    block_tables: [B, max_blocks] int32 (entries past a sequence's last block are ignored);
    context_lens: [B] int32, the keys each query sees (positions 0 .. len-1; 0 gives a zero row).
    Query head h uses KV head h // (num_heads // num_kv_heads); scale is the score factor
    (1/sqrt(d)). Returns [B, num_heads * d] fp32. Softmax is online (running max), stable for any
    score range. Raises ValueError for a block id outside the cache or a length beyond the table."""
    return _run("plk_decode_attention", q, k_cache, v_cache, block_tables, context_lens, float(scale),
                int(block_size), _resolve(isa))[0]


__all__ = [
    "GEMV_INT4_MAX_BATCH", "GEMV_INT8_MAX_BATCH", "GEMV_MAX_BATCH", "ISAS", "KernelsNotBuiltError", "add_rms_norm", "available",
    "W8A8_GROUP", "W8A8_ISAS", "cpu_supports_avx2_fma", "cpu_supports_avx512_vnni", "dequantize_int4", "dequantize_int8", "gemv", "gemv_int4", "gemv_int8", "gemv_w8a8",
    "get_num_threads", "int8_dot_groups", "linear_w8a8", "quantize_activations_int8", "quantize_activations_numpy",
    "w8a8_reference_numpy",
    "library_path", "linear", "linear_int4", "linear_int8", "load", "paged_decode_attention", "quantize_int4_numpy",
    "quantize_int8", "quantize_int8_numpy", "rms_norm",
    "rotary_kv_write", "set_num_threads", "supported_isas",
]
