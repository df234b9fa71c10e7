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
run on several threads, on the library's own pool (csrc/thread_pool.cc): the op is cut into about 4
chunks per thread that the caller and the workers take from a shared counter, and the caller waits
for the chunks to be done, not for the workers to arrive, so a worker that lost its core does not
hold the op up. Idle workers poll for 50 us, then sleep. Small ops run on the calling thread.
`set_num_threads` sets the count (default: the CPUs of the process's affinity mask).

Errors: ops raise ValueError (Paddle's wrapped C++ error text) for a wrong dtype, shape, place, a
non-contiguous tensor or an index outside the cache / rotary table; `load()` raises
KernelsNotBuiltError when the library for the current sources is missing.

Modules: gemv_ops (the GEMVs and their linear_* wrappers), quantize (weights and activations to
int8 / int4), layer_ops (norms, SwiGLU, rotary + KV write, decode attention), all re-exported here;
decode_stack (a whole decode step in one call), thread_tuner, build (the library's build).

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
  gemv_w4a8 / linear_w4a8   the same int4 weights, x quantized to int8 in the call (per row and
                            block of 32; AVX-512 VNNI only)                       -> [B, N]
  dequantize_int4           (q, scale, K) -> the fp32 [N, K] weight gemv_int4 multiplies by
  rms_norm                  x [T, H], weight [H], eps                                -> [T, H]
  add_rms_norm              x, residual [T, H], weight [H], eps      -> (normed [T, H], x + residual)
  rotary_kv_write           qkv [T, (nh + 2 kvh) d] -> q [T, nh, d]; writes k, v into the caches
  paged_decode_attention    q [B, nh, d] over block tables            -> [B, nh * d]
  paged_prefill_attention   q [n, nh, d] of one chunk over its slots  -> [n, nh * d] (causal)
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import paddle

from paddle_llm_ops.cpu_kernels import build as _build

ISAS = ("avx512_vnni", "avx2_fma", "generic")
# The isas on which Int8Linear quantizes activations (gemv_w8a8) by default; on "generic" it keeps the
# weight-only int8 GEMV (more accurate; plain C++ int8 dot products are not measured to be faster).
W8A8_ISAS = ("avx512_vnni", "avx2_fma")
# Activation group for gemv_w8a8 in Int8Linear: one fp32 scale per 32 input channels of each row
# of x, llama.cpp's Q8_0 block. Measured on SmolLM2 (tests/model/test_wint8.py's prompts): one
# scale per row moved the prefill logits 1.15 from the weight-only int8 path and kept 1 of 8 prompts
# greedy-identical to fp32 over 24 tokens (the test needs 4); groups of 32: 0.38 and 4 of 8, the
# weight-only path's own figures. Groups of 32 run the lane paths of csrc/gemv_w8a8_tiles.cc.
W8A8_GROUP = 32

# Batches up to this size use our GEMV in `linear`; larger ones (prefill) use paddle.matmul on the
# same [N, K] weight with transpose_y=True (MKL). Host-dependent (benchmarks/bench_kernels.py
# --only crossover): on the AVX-512 Xeon this was written on, MKL's AVX-512 kernels overtake our
# AVX2 GEMV between 8 and 24 rows (cold weights).
GEMV_MAX_BATCH = 16
# On avx512_vnni `linear` (and the decode stack) run the fp32 GEMM (csrc/gemm_f32.cc: weights repacked
# per call, 16 output channels per register) for GEMV_MAX_BATCH + 1 .. F32_GEMM_MAX_ROWS rows instead
# of MKL: 1.7-1.9x faster than MKL at 32-64 rows on SmolLM2's shapes (benchmarks/bench_int8_batch.py);
# MKL keeps longer batches. kGemvMaxBatch / kF32GemmMaxRows in csrc/kernels.h hold the same numbers.
F32_GEMM_MAX_ROWS = 64
# int8: above this batch the weight is dequantized to a temporary fp32 [N, K] and multiplied by
# paddle.matmul (the temporary lives for one call only; the model keeps the int8 copy alone).
# Dequantizing costs a full pass over the weight, so our int8 GEMV stays ahead much longer.
GEMV_INT8_MAX_BATCH = 64
# From this many activation rows gemv_w8a8 on AVX-512 VNNI runs the int8 GEMM (csrc/gemm_w8a8.cc)
# instead of the GEMV tiles (kW8A8GemmMinRows in csrc/gemv_w8a8.h: keep the two equal).
W8A8_GEMM_MIN_ROWS = 16
# int4: the same rule (the GEMV dequantizes a few rows at a time into L1 for any batch).
GEMV_INT4_MAX_BATCH = 64
# The isas on which Int4Linear quantizes activations (gemv_w4a8: int4 x int8 in vpdpbusd) by
# default; elsewhere it keeps the weight-only int4 GEMV (nibbles widened to fp32).
W4A8_ISAS = ("avx512_vnni",)


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


def set_w8a8_gemm_min_rows(rows: int) -> None:
    """Benchmarks and tests: the fewest activation rows for which gemv_w8a8 runs the AVX-512 VNNI GEMM
    (csrc/gemm_w8a8.cc, bit-identical to the exact path) instead of the GEMV tiles; rows <= 0 restores
    the default (W8A8_GEMM_MIN_ROWS)."""
    load()
    _cdll.plk_set_w8a8_gemm_min_rows(ctypes.c_int64(int(rows)))


def fp32_gemv_max_batch(isa: str) -> int:
    """The most rows `linear` hands to our fp32 kernels on `isa` before MKL: F32_GEMM_MAX_ROWS on
    avx512_vnni (the fp32 GEMM above GEMV_MAX_BATCH), else GEMV_MAX_BATCH."""
    return F32_GEMM_MAX_ROWS if _resolve(isa) == "avx512_vnni" else GEMV_MAX_BATCH


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


# The ops, by job (after the loader and the constants above, which they import).
from paddle_llm_ops.cpu_kernels.gemv_ops import (dequantize_int4, dequantize_int8, gemm_f32, gemv, gemv_int4,  # noqa: E402
                                                 gemv_int8, gemv_w4a8, gemv_w8a8, int8_dot_groups, linear,
                                                 linear_int4, linear_int8, linear_w4a8, linear_w8a8)
from paddle_llm_ops.cpu_kernels.layer_ops import (add_rms_norm, paged_decode_attention, paged_prefill_attention, rms_norm,  # noqa: E402
                                                  rotary_kv_write, swiglu)
from paddle_llm_ops.cpu_kernels.quantize import (quantize_activations_int8, quantize_activations_numpy,  # noqa: E402
                                                 quantize_int4_numpy, quantize_int8, quantize_int8_numpy)

__all__ = [
    "F32_GEMM_MAX_ROWS", "GEMV_INT4_MAX_BATCH", "GEMV_INT8_MAX_BATCH", "GEMV_MAX_BATCH", "ISAS", "KernelsNotBuiltError", "W4A8_ISAS",
    "W8A8_GROUP", "W8A8_ISAS", "add_rms_norm", "available", "c_library", "cpu_supports_avx2_fma", "cpu_supports_avx512_vnni",
    "dequantize_int4", "dequantize_int8", "fp32_gemv_max_batch", "gemm_f32", "gemv", "gemv_int4", "gemv_int8", "gemv_w4a8", "gemv_w8a8",
    "get_num_threads",
    "int8_dot_groups", "library_path", "linear", "linear_int4", "linear_int8", "linear_w4a8", "linear_w8a8",
    "load",
    "paged_decode_attention", "paged_prefill_attention", "quantize_activations_int8", "quantize_activations_numpy", "quantize_int4_numpy",
    "quantize_int8", "quantize_int8_numpy", "rms_norm", "rotary_kv_write", "set_num_threads", "set_w8a8_gemm_min_rows", "supported_isas",
    "swiglu",
]
