"""The platform layer: which device an engine runs on, what that place can run (kernels, dtypes,
Paddle flags; decided once at engine start and logged with reasons), how a process binds to it
(kernel threads, memory for the KV cache, device count and collective backend for tensor
parallelism), plug-in version checks and device memory queries.

Modules: device (the Device value, device resolution, GCU plug-in versions, memory), cgroup (the
CPUs and memory this process's cgroup and CPU affinity allow), cpu_features
(/proc/cpuinfo flags), kernel_registry (Paddle's registered kernels per place and dtype),
kernel_checks (optional kernels checked against the composed ops), settings (the operator's
settings checked), plan (the decisions, and the OpSet they make), process_plan (the facts of this
process and its plan), runtime (one Platform per device kind: binding, threads, memory, devices,
collectives).
"""

from paddle_llm_engine.platforms.cpu_features import CpuInfo, host_cpu, parse_cpuinfo
from paddle_llm_engine.platforms.device import (SUPPORTED_GCU_MATRIX, Device, PlatformError, check_gcu_versions,
                                                gcu_available, gcu_available_memory, host_available_memory,
                                                host_memory_report, resolve_device)
from paddle_llm_engine.platforms.kernel_registry import KernelRegistry
from paddle_llm_engine.platforms.plan import PlaceFacts, PlatformPlan, decide
from paddle_llm_engine.platforms.process_plan import plan_for_device
from paddle_llm_engine.platforms.settings import check_settings
from paddle_llm_engine.platforms.runtime import CpuPlatform, GcuPlatform, Platform, platform_for

__all__ = [
    "SUPPORTED_GCU_MATRIX", "CpuInfo", "CpuPlatform", "Device", "GcuPlatform", "KernelRegistry", "PlaceFacts",
    "Platform", "PlatformError", "PlatformPlan", "check_gcu_versions", "check_settings", "decide", "gcu_available",
    "gcu_available_memory", "host_available_memory", "host_cpu", "host_memory_report", "parse_cpuinfo",
    "plan_for_device", "platform_for", "resolve_device",
]
