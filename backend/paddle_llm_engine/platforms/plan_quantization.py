"""The platform plan's quantization decisions (plan.decide calls these): which kernel runs a quantized
linear on the place, how wint8 / wint4 linears treat activations on the CPU, and whether wint8
prompt chunks take the int8 GEMM (wint8_prefill_activations). Also `verified`, the numerical check
every optional kernel passes before a plan turns it on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from paddle_llm_engine.platforms import gcu_kernels
from paddle_llm_engine.platforms.device import PlatformError
from paddle_llm_engine.platforms.kernel_checks import ChildVerdict
from paddle_llm_ops.gcu.linear_quant import GCU_GROUP_SIZES

if TYPE_CHECKING:
    from paddle_llm_engine.platforms.plan import PlaceFacts

# verify(kernel name, compute dtype, **check parameters) -> ChildVerdict (kernel_checks.PlaceVerifier).
Verify = Callable[..., ChildVerdict]


def verified(name: str, reason: str, verify: Verify, dtype: str, params: dict) -> tuple[bool, str]:
    """(on, reason) of a kernel its decider would turn on, after its numerical check on this place
    (verify). A verifier that raises counts as a failed check."""
    try:
        verdict = verify(name, dtype, **params)
    except Exception as e:  # the verifier itself failed: the kernel stays off, and the log says why
        verdict = ChildVerdict(False, f"the check raised {type(e).__name__}: {e}")
    if not verdict.ok:
        return False, f"verification failed: {verdict.detail}"
    return True, f"{reason}; verified{' (cached verdict)' if verdict.cached else ''}: {verdict.detail}"


def decide_quantization(facts: PlaceFacts, quant: tuple[str, int], dtype: str, cpu_isa: str | None,
                         cpu_reason: str, verify: Verify, out: list[str]) -> None:
    """quant: (quantization, resolved group size). On the CPU the C++ int8 / int4 GEMV (needs the C++
    CPU kernels); on a GCU paddle-custom-gcu's linear_quant_gcu, when the plug-in registers it with
    the expected signature and its check passes. Raises PlatformError otherwise (no fallback: the
    operator asked for the memory saving)."""
    quantization, group_size = quant
    if not quantization:
        return
    bits = 8 if quantization == "wint8" else 4
    what = (f"weight-only symmetric int{bits}, one scale per "
            f"{'output channel' if group_size == -1 else f'group of {group_size} input channels'}")
    if facts.device.kind == "cpu":
        if cpu_isa is None:
            raise PlatformError(f"quantization {quantization} on the CPU runs on the C++ int{bits} GEMV, but the C++ "
                                f"CPU kernels are off ({cpu_reason}); use kernels auto or leave quantization empty")
        if bits == 8:  # its own line first: the quantization line stays last (and unchanged in form)
            out.append(f"wint8 activations: {_int8_cpu_path(cpu_isa)}")
        else:
            out.append(f"wint4 activations: {_int4_cpu_path(cpu_isa)}")
        out.append(f"quantization {quantization}: {what} (fp32 scales), C++ int{bits} GEMV ({cpu_isa}) for every "
                   f"linear and the LM head")
        return
    if group_size not in GCU_GROUP_SIZES:
        raise PlatformError(f"quantization_group_size {group_size} is not supported on {facts.device}: "
                            f"paddle-custom-gcu's linear_quant_gcu takes -1, 64 or 128")
    ok, reason = gcu_kernels.plugin_ops(facts, ("linear_quant_gcu",))
    if ok:
        ok, reason = verified("gcu_linear_quant", reason, verify, dtype, {"bits": bits, "group_size": group_size})
    if not ok:
        raise PlatformError(f"quantization {quantization} is not supported on {facts.device}: it runs through "
                            f"paddle-custom-gcu's linear_quant_gcu, and {reason}; leave quantization empty")
    out.append(f"quantization {quantization}: {what} (scales in {dtype}), linear_quant_gcu for every linear and "
               f"the LM head; {reason}")


def _int8_cpu_path(cpu_isa: str) -> str:
    """How wint8 linears treat activations on the CPU for a C++ kernel isa (the default of
    paddle_llm_ops.linear.Int8Linear: int8 on the vector isas, fp32 on the portable path)."""
    group = "one fp32 scale per row and 32 input channels (llama.cpp's Q8_0 block)"
    if cpu_isa == "avx512_vnni":
        return f"quantized to int8 in each call, {group}; int8 x int8 dot products with int32 sums on AVX-512 VNNI " \
               f"(vpdpbusd)"
    if cpu_isa == "avx2_fma":
        return f"quantized to int8 in each call, {group}; int8 x int8 dot products with int32 sums on AVX2 " \
               f"(vpmaddubsw/vpmaddwd)"
    return ("fp32, weight-only int8 GEMV (the portable path; int8 x int8 is chosen where AVX2 or AVX-512 VNNI "
            "makes it faster)")


def _int4_cpu_path(cpu_isa: str) -> str:
    """How wint4 linears treat activations on the CPU for a C++ kernel isa (the default of
    paddle_llm_ops.linear.Int4Linear: int8 on AVX-512 VNNI where the widths allow, else fp32)."""
    if cpu_isa == "avx512_vnni":
        return ("quantized to int8 in each call, one fp32 scale per row and 32 input channels; int4 x int8 dot "
                "products with int32 sums on AVX-512 VNNI (vpdpbusd) for linears whose input width and group size "
                "are multiples of 32, the weight-only int4 GEMV for the others")
    return "fp32, weight-only int4 GEMV (the nibbles widened to fp32; int4 x int8 runs on AVX-512 VNNI only)"


def decide_prefill_activations(asked: str, quantization: str, device: str, cpu_isa: str | None,
                                out: list[str]) -> bool:
    """wint8 steps of more than 64 rows: int8 activations (the AVX-512 VNNI int8 GEMM) when asked and
    the C++ kernels run avx512_vnni, else fp32 (a log line only when int8 was asked)."""
    if quantization != "wint8" or asked != "int8":
        return False
    if device != "cpu":
        out.append(f"wint8 prefill activations: not applied on {device} (int8 asked; the device's "
                   f"linear_quant_gcu multiplies as it does)")
        return False
    if cpu_isa != "avx512_vnni":
        out.append(f"wint8 prefill activations: fp32, although int8 was asked: the int8 GEMM is AVX-512 VNNI "
                   f"code for the C++ CPU kernels, and they run {cpu_isa or 'off'} here")
        return False
    out.append("wint8 prefill activations: int8 (wint8_prefill_activations int8): every step's rows run the "
               "int8 GEMM, activations quantized per row and block of 32")
    return True
