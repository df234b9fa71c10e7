"""The platform layer's decisions for one engine: what this place can run, decided once at start.

`decide()` is a pure function of the facts about a place (CPU flags, Paddle's kernel registry,
whether Paddle falls back to CPU kernels on a custom device) and of the operator's settings, so the
logic is tested for hosts we do not have (process_plan.plan_for_device() gathers the facts of this
process and calls it). The plan builds the engine's OpSet (PlatformPlan.opset). Nothing here
catches an op's failure to find out whether it works: every optional kernel about to be turned on
is first checked numerically against the composed ops on this place (kernel_checks.py: in a child
process where the kernel could kill the process, verdicts of CPU kernels cached) and stays off,
with the reason, when it disagrees. The operator's settings are checked first (settings.py).

Decided here:
- dtype (weights and activations): "auto" is the fastest dtype the place has kernels for
  (bfloat16, then float16, then float32); an explicit dtype the place lacks kernels for is refused.
- kv_cache_dtype: "auto" follows dtype. A narrower one (bfloat16 / float16 under float32 compute)
  is read directly by the C++ CPU kernels (rounded once on write, widened exactly on read);
  elsewhere it is storage only (cast on write and read).
- optional kernels ("fused_rms_norm", "fused_moe"): on where the place can run them, unless the
  operator forces the composed path (`kernels: composed`) or names the kernels to use.
- Paddle flags the place needs (FLAGS_use_stride_kernel off where the device has no `contiguous`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from paddle_llm_engine.platforms.kernel_checks import ChildVerdict
from paddle_llm_engine.platforms.cpu_features import CpuInfo
from paddle_llm_engine.platforms.device import Device, PlatformError
from paddle_llm_engine.platforms import gcu_kernels
from paddle_llm_engine.platforms.kernel_registry import KernelRegistry
from paddle_llm_engine.platforms.settings import (OPTIONAL_KERNELS, check_prefill_activations, check_settings,
                                                  parse_kernels_setting)
from paddle_llm_engine.platforms.plan_quantization import (Verify, decide_prefill_activations, decide_quantization,
                                                           verified)

log = logging.getLogger(__name__)

# The fastest first: what "auto" tries.
_AUTO_ORDER = ("bfloat16", "float16", "float32")
# Ops the model's forward runs in the compute dtype (composed path).
COMPUTE_OPS = ("matmul", "softmax", "swiglu", "index_select", "add", "multiply", "rsqrt", "mean", "concat",
               "split", "transpose", "cast")
# Ops a KV cache of a given dtype needs: writes cast and scatter, reads gather (possibly through a
# same-width view, see _gather_dtype) and cast.
KV_WRITE_OPS = ("cast", "index_put")
_SAME_WIDTH = {"float16": ("bfloat16",), "bfloat16": ("float16",), "float32": ()}
# The fused mixture-of-experts kernel: paddle-custom-gcu's custom operators, as FastDeploy's GCU MoE
# uses them (paddle_llm_ops.moe). Paddle itself registers none for the CPU (its fused_moe is CUDA-only).
FUSED_MOE_OPS = gcu_kernels.FUSED_MOE_OPS
# The C++ CPU kernels' AVX-512 path (isa "avx512_vnni": vpdpbusd for the int8 x int8 GEMV of wint8,
# AVX2+FMA code for every other op): the flags its code needs besides avx2 and fma.
CPU_VNNI_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")
# The KV cache types the C++ kernels write and read (widened to fp32 when read).
CPU_KERNEL_KV_DTYPES = ("float32", "bfloat16", "float16")
# Paddle 3.3's CPU fused_rms_norm (phi::fusion::RmsNormAvxKernel) executes AVX-512 instructions
# whatever the CPU: on an AVX2-only host the process dies with SIGILL.
FUSED_RMS_NORM_CPU_FLAGS = ("avx512f",)


@dataclass(frozen=True)
class PlaceFacts:
    """What is known about one place. device: a Device (or its name, "cpu" / "gcu:<id>", parsed
    here); cpu: the host CPU; registry: Paddle's registered kernels; kernel_fallback: Paddle runs an
    op that has no kernel for a custom device through its CPU kernel
    (FLAGS_enable_api_kernel_fallback); paddle_version: for the child-check cache;
    device_description: one line naming the device (the plug-in for a GCU); cpu_kernels_built /
    cpu_kernels_detail: whether the C++ CPU kernels loaded, and why not; op_signatures: {custom op:
    (its registered signature is the expected one, detail naming both)} of the plug-in's ops the GCU
    kernels call (gcu_kernels.gather_signatures; empty on the CPU)."""

    device: Device
    cpu: CpuInfo
    registry: KernelRegistry
    kernel_fallback: bool = True
    paddle_version: str = ""
    device_description: str = ""
    cpu_kernels_built: bool = False
    cpu_kernels_detail: str = "not looked for"
    op_signatures: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "device", Device.parse(self.device))


@dataclass
class PlatformPlan:
    """The decisions for one engine. dtype / kv_cache_dtype: Paddle dtype names; kv_gather_dtype:
    the dtype the cache is viewed as for gathers (same width as kv_cache_dtype; differs when the
    place has no gather kernel for the cache's own dtype); kernels: optional kernel name -> on;
    flags: Paddle flags to set before the model is built; cpu_isa: the dispatch path of the C++ CPU
    kernels ("avx512_vnni" | "avx2_fma" | "generic") when kernels["cpu_kernels"] is on, else None; quantization: "",
    "wint8" or "wint4"; quantization_group_size: -1 (per output channel) or the input channels per
    scale (resolved, never 0); w8a8_prefill: wint8 steps of more than 64 rows quantize their
    activations to int8 (the int8 GEMM; wint8_prefill_activations int8 on an AVX-512 VNNI host);
    decisions: one log line per decision, each with its reason."""

    device: str
    dtype: str
    kv_cache_dtype: str
    kv_gather_dtype: str
    kernels: dict[str, bool] = field(default_factory=dict)
    cpu_isa: str | None = None
    quantization: str = ""
    quantization_group_size: int = -1
    w8a8_prefill: bool = False
    flags: dict[str, object] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)

    def log(self, logger: logging.Logger = log) -> None:
        for line in self.decisions:
            logger.info("platform %s: %s", self.device, line)

    def opset(self, block_size: int):
        """The OpSet (paddle_llm_ops.OpSet) of this plan's kernels for a KV cache of block_size
        tokens per block: every optional kernel but cpu_kernels is the build_opset flag of its name;
        cpu_kernels runs as cpu_isa. Raises ValueError as build_opset."""
        from paddle_llm_ops import build_opset

        flags = {name: on for name, on in self.kernels.items() if name != "cpu_kernels"}
        gather = self.kv_gather_dtype if self.kv_gather_dtype != self.kv_cache_dtype else None
        return build_opset(cpu_isa=self.cpu_isa, kv_gather_dtype=gather, quantization=self.quantization,
                           quantization_group_size=self.quantization_group_size, block_size=block_size,
                           w8a8_prefill=self.w8a8_prefill, **flags)


def _is_custom(device: Device) -> bool:
    return device.kind != "cpu"


def _usable(facts: PlaceFacts, ops, dtype: str) -> tuple[bool, list[str]]:
    """(every op runs in dtype on the place, the ops that only run through the CPU fallback)."""
    native_missing = facts.registry.missing(ops, facts.device, dtype)
    if not native_missing:
        return True, []
    if _is_custom(facts.device) and facts.kernel_fallback:
        cpu_missing = facts.registry.missing(native_missing, "cpu", dtype)
        return not cpu_missing, native_missing
    return False, native_missing


def _decide_dtype(facts: PlaceFacts, requested: str, out: list[str]) -> str:
    place = "the CPU" if facts.device.kind == "cpu" else f"{facts.device}"
    if requested != "auto":
        ok, _ = _usable(facts, COMPUTE_OPS, requested)
        if not ok:
            lacking = facts.registry.missing(COMPUTE_OPS, facts.device, requested)
            raise PlatformError(
                f"dtype {requested} is not supported on {facts.device}: Paddle has no {requested} kernel on "
                f"{place} for {', '.join(lacking)}; set dtype to auto or float32")
        out.append(f"dtype {requested}: set by the operator")
        return requested
    skipped = []
    for dt in _AUTO_ORDER:
        native = not facts.registry.missing(COMPUTE_OPS, facts.device, dt)
        if native:
            why = f"the fastest dtype with {place} kernels for every op of the model"
            if skipped:
                why += f" ({'; '.join(skipped)})"
            out.append(f"dtype {dt} (auto): {why}")
            return dt
        lacking = facts.registry.missing(COMPUTE_OPS, facts.device, dt)
        skipped.append(f"no {dt}: {place} lacks {', '.join(lacking[:4])}{' ...' if len(lacking) > 4 else ''}")
    ok, fallback = _usable(facts, COMPUTE_OPS, "float32")
    if not ok:
        raise PlatformError(f"{facts.device} has no float32 kernels for {', '.join(fallback)}, not even through "
                            f"Paddle's CPU fallback")
    out.append(f"dtype float32 (auto): {'; '.join(skipped[:-1]) or 'no faster dtype'}; float32 runs "
               f"{len(fallback)} of {len(COMPUTE_OPS)} ops through Paddle's CPU kernel fallback")
    return "float32"


def _gather_dtype(facts: PlaceFacts, kv_dtype: str) -> str | None:
    for dt in (kv_dtype,) + _SAME_WIDTH[kv_dtype]:
        if _usable(facts, ("index_select",), dt)[0]:
            return dt
    return None


def _decide_kv(facts: PlaceFacts, requested: str, dtype: str, out: list[str]) -> tuple[str, str]:
    kv = dtype if requested == "auto" else requested
    ok, _ = _usable(facts, KV_WRITE_OPS, kv)
    gather = _gather_dtype(facts, kv)
    if not ok or gather is None:
        lacking = facts.registry.missing(KV_WRITE_OPS + ("index_select",), facts.device, kv)
        raise PlatformError(f"kv_cache_dtype {kv} is not supported on {facts.device}: no {kv} kernel for "
                            f"{', '.join(lacking)}; set kv_cache_dtype to auto or float32")
    how = "follows dtype" if requested == "auto" else "set by the operator"
    if kv != dtype:
        how += f"; stored as {kv}, cast to {dtype} when read (half the KV memory of float32)" \
            if kv != "float32" else f"; stored as float32, cast to {dtype} when read"
    if gather != kv:
        how += f"; gathered through a bit-identical {gather} view (no {kv} index_select kernel)"
    out.append(f"kv_cache_dtype {kv}: {how}")
    return kv, gather


def _fused_rms_norm(facts: PlaceFacts, dtype: str) -> tuple[bool, str]:
    """(can run, reason) for Paddle's fused RMSNorm kernel (registered as fused_rms_norm_quant)."""
    if facts.device.kind == "cpu":
        missing = facts.cpu.missing(*FUSED_RMS_NORM_CPU_FLAGS)
        if missing:
            return False, f"CPU lacks {', '.join(missing)} (Paddle's CPU kernel runs AVX-512 unconditionally)"
        if not facts.registry.has("fused_rms_norm_quant", "cpu", dtype):
            return False, f"Paddle has no CPU fused_rms_norm_quant kernel for {dtype}"
        return True, f"CPU has {', '.join(FUSED_RMS_NORM_CPU_FLAGS)}"
    return gcu_kernels.fused_rms_norm_on_plugin(facts)


def _cpu_kernels(facts: PlaceFacts, dtype: str, kv: str) -> tuple[bool, str, str | None]:
    """(can run, reason, isa) for the C++ CPU kernels (paddle_llm_ops.cpu_kernels). The isa comes
    from the CPU's flags: "avx512_vnni" (AVX-512 VNNI int8 dot products for wint8, AVX2+FMA for the
    rest) where avx2, fma, avx512f, avx512bw and avx512_vnni are all present; "avx2_fma" where avx2
    and fma are; else "generic" (portable code)."""
    if facts.device.kind != "cpu":
        return False, "the C++ CPU kernels serve the CPU place only; the device's own kernels run", None
    if not facts.cpu_kernels_built:
        return False, f"not available: {facts.cpu_kernels_detail}", None
    if dtype != "float32" or kv not in CPU_KERNEL_KV_DTYPES:
        return False, (f"they need float32 compute and a float32, bfloat16 or float16 KV cache (dtype {dtype}, "
                       f"kv_cache_dtype {kv})"), None
    if facts.cpu.has("avx2", "fma", *CPU_VNNI_FLAGS):
        return (True, "AVX-512 VNNI path for int8 dot products and AVX2+FMA for the rest, the CPU has avx2, fma, "
                f"{', '.join(CPU_VNNI_FLAGS)}", "avx512_vnni")
    if facts.cpu.has("avx2", "fma"):
        # (the wint8 decision line says the int8 dot products run on AVX2 here)
        return True, "AVX2+FMA path, the CPU has avx2 and fma", "avx2_fma"
    return True, f"portable path, the CPU lacks {', '.join(facts.cpu.missing('avx2', 'fma'))}", "generic"


def _decide_kernels(facts: PlaceFacts, kernels: str, dt: str, kv: str, verify: Verify,
                    out: list[str]) -> tuple[dict[str, bool], str | None, str]:
    """(optional kernel -> on, the C++ CPU kernels' isa or None, why they are on / off)."""
    mode, forced = parse_kernels_setting(kernels)
    chosen: dict[str, bool] = {}
    isa: list[str | None] = [None]

    def cpu_decider():
        ok, reason, isa[0] = _cpu_kernels(facts, dt, kv)
        return ok, reason

    def rms_decider():
        if chosen.get("cpu_kernels"):
            return False, "the C++ CPU kernels' RMSNorm runs instead"
        return _fused_rms_norm(facts, dt)

    deciders = {"cpu_kernels": cpu_decider, "fused_rms_norm": rms_decider,
                "fused_moe": lambda: gcu_kernels.fused_moe(facts),
                "gcu_attention": lambda: gcu_kernels.gcu_attention(facts, dt, kv),
                "gcu_rotary": lambda: gcu_kernels.gcu_rotary(facts), "gcu_rms_norm": lambda: gcu_kernels.gcu_rms_norm(facts)}
    cpu_reason = "set to composed by the operator" if mode == "composed" else "not in the operator's kernels list"
    for name in OPTIONAL_KERNELS:
        if mode == "composed":
            chosen[name] = False
            out.append(f"{name}: off, kernels set to composed by the operator")
            continue
        if mode == "list" and name not in forced:
            chosen[name] = False
            out.append(f"{name}: off, not in the operator's kernels list")
            continue
        ok, reason = deciders[name]()
        if ok:  # no unverified kernel: its check against the composed ops runs first
            ok, reason = verified(name, reason, verify, dt, {"isa": isa[0]} if name == "cpu_kernels" else {})
        if mode == "list" and not ok:
            raise PlatformError(f"kernels lists {name}, which {facts.device} cannot run: {reason}")
        chosen[name] = ok
        if name == "cpu_kernels":
            cpu_reason = reason
        out.append(f"{name}: {'on' if ok else 'off'}, {reason}")
    return chosen, isa[0] if chosen.get("cpu_kernels") else None, cpu_reason


def decide(facts: PlaceFacts, dtype: str = "auto", kv_cache_dtype: str = "auto", kernels: str = "auto",
           verify: Verify | None = None, quantization: str = "", quantization_group_size: int = 0,
           wint8_prefill_activations: str = "fp32") -> PlatformPlan:
    """The PlatformPlan for a place. verify(kernel name, dtype, **params) -> ChildVerdict checks an
    optional kernel against the composed ops before it is turned on (kernel_checks.PlaceVerifier;
    the C++ CPU kernels get params isa=<their dispatch path>); tests pass their own; without one,
    every optional kernel stays off. quantization: "", "wint8" or "wint4", quantization_group_size as
    check_settings takes it (the plan holds the resolved value); wint8_prefill_activations as
    check_prefill_activations takes it ("int8" holds where the C++ kernels run avx512_vnni).
    With the C++ CPU kernels on, Paddle's fused RMSNorm is not used (they bring their own).

    Raises PlatformError for a dtype, kv_cache_dtype or forced kernel the place cannot run, and
    ValueError for a malformed setting (naming it)."""
    group_size = check_settings(dtype, kv_cache_dtype, quantization, quantization_group_size)
    prefill_acts = check_prefill_activations(wint8_prefill_activations, quantization)
    parse_kernels_setting(kernels)  # a malformed list is refused before anything is decided
    if verify is None:
        def verify(name, dtype="float32", **params):
            return ChildVerdict(False, "no verifier given")
    decisions: list[str] = []
    if facts.device_description:
        decisions.append(f"device: {facts.device_description}")
    if facts.device.kind == "cpu":
        decisions.append(f"CPU {facts.cpu.model or 'unknown model'}: "
                         f"{'avx512f' if facts.cpu.has('avx512f') else 'no avx512f'}, "
                         f"{'avx2+fma' if facts.cpu.has('avx2', 'fma') else 'no avx2+fma'}")
    flags: dict[str, object] = {}
    if _is_custom(facts.device) and not facts.registry.has("contiguous", facts.device, "float32"):
        flags["FLAGS_use_stride_kernel"] = False
        decisions.append("FLAGS_use_stride_kernel off: the device has no 'contiguous' kernel, which strided "
                         "views would need")
    dt = _decide_dtype(facts, dtype, decisions)
    kv, gather = _decide_kv(facts, kv_cache_dtype, dt, decisions)
    chosen, cpu_isa, cpu_reason = _decide_kernels(facts, kernels, dt, kv, verify, decisions)
    # before the quantization line, which stays the last one
    w8a8_prefill = decide_prefill_activations(prefill_acts, quantization, facts.device.kind, cpu_isa, decisions)
    decide_quantization(facts, (quantization, group_size), dt, cpu_isa, cpu_reason, verify, decisions)
    return PlatformPlan(device=facts.device, dtype=dt, kv_cache_dtype=kv, kv_gather_dtype=gather,
                        kernels=chosen, flags=flags, cpu_isa=cpu_isa, quantization=quantization,
                        quantization_group_size=group_size, w8a8_prefill=w8a8_prefill, decisions=decisions)
