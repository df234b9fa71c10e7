"""The platform layer: which device an engine runs on, what that place can run (kernels, dtypes,
Paddle flags; decided once at engine start and logged with reasons), plug-in version checks and
device memory queries.

Modules: device (the Device value, device resolution, GCU plug-in versions, memory), cpu_features
(/proc/cpuinfo flags), kernel_registry (Paddle's registered kernels per place and dtype),
child_check (risky kernels verified in a child process), plan (the decisions).
"""

from paddle_llm_engine.platforms.cpu_features import CpuInfo, host_cpu, parse_cpuinfo
from paddle_llm_engine.platforms.device import (SUPPORTED_GCU_MATRIX, Device, PlatformError, check_gcu_versions,
                                                gcu_available, gcu_available_memory, host_available_memory,
                                                resolve_device)
from paddle_llm_engine.platforms.kernel_registry import KernelRegistry
from paddle_llm_engine.platforms.plan import PlaceFacts, PlatformPlan, check_settings, decide, plan_for_device

__all__ = [
    "SUPPORTED_GCU_MATRIX", "CpuInfo", "Device", "KernelRegistry", "PlaceFacts", "PlatformError", "PlatformPlan",
    "check_gcu_versions", "check_settings", "decide", "gcu_available", "gcu_available_memory", "host_available_memory",
    "host_cpu", "parse_cpuinfo", "plan_for_device", "resolve_device",
]
