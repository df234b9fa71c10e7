"""The platform plan of a place in this process: gather_facts() reads what this process can see
(CPU flags, Paddle's kernel registry and flags, the GCU plug-in's ops, whether the C++ CPU kernels
load), plan_for_device() hands those facts to plan.decide(), logs the decisions and applies the
plan's Paddle flags."""

from __future__ import annotations

from paddle_llm_engine.platforms import gcu_kernels
from paddle_llm_engine.platforms.device import Device
from paddle_llm_engine.platforms.kernel_registry import KernelRegistry
from paddle_llm_engine.platforms.plan import PlaceFacts, PlatformPlan, decide
from paddle_llm_engine.platforms.settings import parse_kernels_setting


def _load_cpu_kernels(device: Device, kernels: str) -> tuple[bool, str]:
    """(the C++ CPU kernels are loaded, why not) for a place whose plan may turn them on: loads the
    library now (registering its ops with Paddle), so that a library that does not load leaves the
    kernels off instead of failing later. Nothing is loaded where the plan cannot use them."""
    mode, forced = parse_kernels_setting(kernels)
    if device.kind != "cpu":
        return False, "the CPU place only"
    if mode == "composed" or (mode == "list" and "cpu_kernels" not in forced):
        return False, "not requested"
    from paddle_llm_ops import cpu_kernels

    try:
        cpu_kernels.load()
        return True, "built"
    except Exception as e:  # not built for these sources: the composed ops run, and the log says why
        return False, str(e)


def gather_facts(device: Device | str, cpu_kernels: tuple[bool, str] = (False, "not looked for")) -> PlaceFacts:
    """The facts of this process for `device`; cpu_kernels: (loaded, why not) of the C++ CPU kernels."""
    import paddle

    from paddle_llm_engine.platforms.cpu_features import host_cpu
    from paddle_llm_engine.platforms.device import gcu_plugin_description

    device = Device.parse(device)
    try:
        fallback = bool(paddle.get_flags(["FLAGS_enable_api_kernel_fallback"])["FLAGS_enable_api_kernel_fallback"])
    except Exception:  # flag unknown to this Paddle: assume its documented default (on)
        fallback = True
    description = "" if device.kind == "cpu" else f"{device} through {gcu_plugin_description()}"
    return PlaceFacts(device=device, cpu=host_cpu(), registry=KernelRegistry(), kernel_fallback=fallback,
                      paddle_version=paddle.__version__, device_description=description,
                      op_signatures=gcu_kernels.gather_signatures(device.kind),
                      cpu_kernels_built=cpu_kernels[0], cpu_kernels_detail=cpu_kernels[1])


def plan_for_device(device: Device | str, dtype: str = "auto", kv_cache_dtype: str = "auto",
                    kernels: str = "auto", quantization: str = "", quantization_group_size: int = 0,
                    wint8_prefill_activations: str = "fp32") -> PlatformPlan:
    """Decide for `device` in this process, log every decision, apply the plan's Paddle flags.
    Raises as decide()."""
    import paddle

    from paddle_llm_engine.platforms.kernel_checks import PlaceVerifier

    device = Device.parse(device)
    facts = gather_facts(device, _load_cpu_kernels(device, kernels))

    verify = PlaceVerifier(device.kind == "cpu", facts.paddle_version, facts.cpu.model, facts.cpu.flags)
    plan = decide(facts, dtype, kv_cache_dtype, kernels, verify, quantization, quantization_group_size,
                  wint8_prefill_activations)
    if verify.timings:
        plan.decisions.append("kernel checks: " + ", ".join(
            f"{name} {'cached' if cached else f'{secs:.3f} s'}" for name, secs, cached in verify.timings))
    if plan.flags:
        paddle.set_flags(plan.flags)
    plan.log()
    return plan
