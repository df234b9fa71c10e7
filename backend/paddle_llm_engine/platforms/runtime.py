"""What differs between the kinds of place at run time, decided here and nowhere else: how a process
binds to its device, how many kernel threads it runs, how much memory is left for the KV cache,
how many devices tensor parallelism can use, and which collective backend its ranks join.

One Platform object per device kind: CpuPlatform ("cpu") and GcuPlatform ("gcu", the
paddle-custom-gcu plug-in); platform_for(device) picks it. The worker (worker/worker.py) and the
tensor-parallel executor (executor/) only call these methods.
"""

from __future__ import annotations

from paddle_llm_engine.platforms import cgroup
from paddle_llm_engine.platforms.device import (Device, check_gcu_versions, gcu_available_memory,
                                                host_available_memory)


class Platform:
    """The run-time decisions for one device kind (see the module docstring)."""

    kind = ""

    def kernel_threads(self, num_threads: int, ranks_on_host: int = 1) -> int:
        """CPU threads for one process's kernels: the operator's num_threads when set (> 0), else the
        CPUs this process may use (cgroup.usable_cpus: affinity mask and cgroup CPU quota, not the
        node's cores) shared evenly by the `ranks_on_host` processes of one engine (at least 1)."""
        return self.kernel_threads_report(num_threads, ranks_on_host)[0]

    def kernel_threads_report(self, num_threads: int, ranks_on_host: int = 1) -> tuple[int, str]:
        """(kernel_threads(...), where that count comes from), for the start-up log."""
        if num_threads:
            return num_threads, "num_threads"
        cpus, source = cgroup.usable_cpus()
        ranks = max(1, ranks_on_host)
        # More threads than CPUs the quota pays for are throttled in every CFS period, each step waiting
        # for the slowest thread: the count is the usable CPUs, never the node's cores.
        return max(1, cpus // ranks), source + (f", shared by {ranks} ranks" if ranks > 1 else "")

    def activate(self, device: Device, threads: int) -> None:
        """Bind this process to `device` (Paddle's current place) with `threads` kernel threads."""
        raise NotImplementedError

    def configure_kernels(self, plan, threads: int) -> None:
        """Settings of the optional kernels the platform plan turned on (nothing by default)."""

    def use_huge_pages(self, root, what: str, collapse: bool = True) -> str:
        """Put the host memory of the tensors reachable from `root` (the weights, the KV caches) on
        2 MiB pages where the host allows it, now (collapse) or over time; a log line saying what
        happened, "" where the platform's tensors are not in host memory (nothing by default). Never
        raises for an OS refusal."""
        return ""

    def available_memory(self, device: Device, ranks_on_host: int = 1) -> int | None:
        """Bytes the KV cache of one rank could take now (weights loaded), or None when unknown."""
        raise NotImplementedError

    # Where available_memory's figure comes from, for the KV sizing log line.
    memory_source = "the platform's memory query"

    def memory_report(self, device: Device, ranks_on_host: int = 1) -> tuple[int | None, str]:
        """(available_memory(...), where that figure comes from, or why there is none)."""
        avail = self.available_memory(device, ranks_on_host)
        return avail, self.memory_source if avail is not None else f"{self.memory_source} gave no figure"

    def device_count(self, device: Device) -> tuple[int, str]:
        """(how many ranks of one engine this kind of place can hold, what that count is)."""
        raise NotImplementedError

    def rank_devices(self, size: int, device: Device) -> list[Device]:
        """The devices of ranks 0 .. size - 1 of an engine whose first device is `device`. Raises
        ValueError naming both numbers when there are not enough."""
        raise NotImplementedError

    def collective_env(self, device: Device) -> dict[str, str]:
        """The environment that makes a rank on `device` join paddle.distributed's collective
        backend for this kind of place."""
        raise NotImplementedError


class CpuPlatform(Platform):
    """The host CPU: Paddle's CPU kernels (and the C++ CPU kernels where the plan turns them on),
    gloo collectives, the host's available memory (capped by the cgroup memory limit) shared by
    the ranks."""

    kind = "cpu"

    def activate(self, device: Device, threads: int) -> None:
        import paddle

        paddle.set_device("cpu")
        # Paddle sets OMP_NUM_THREADS=1 on import when it is unset: the count is always set here.
        paddle.base.core.set_num_threads(threads)

    def configure_kernels(self, plan, threads: int) -> None:
        """The C++ CPU kernels use as many threads as Paddle's kernels."""
        if plan.cpu_isa is not None:
            from paddle_llm_ops import cpu_kernels

            cpu_kernels.set_num_threads(threads)

    def use_huge_pages(self, root, what: str, collapse: bool = True) -> str:
        """huge_pages.advise_huge_pages over the CPU tensors reachable from `root`."""
        import time

        from paddle_llm_engine.platforms.huge_pages import advise_huge_pages, paddle_cpu_ranges

        t0 = time.monotonic()
        rep = advise_huge_pages(paddle_cpu_ranges(root), collapse=collapse)
        return f"{what}: {rep.outcome} ({time.monotonic() - t0:.2f} s)"

    # host_available_memory logs which of the two it was, with the figures
    memory_source = "the host's MemAvailable or the cgroup memory limit's headroom, the smaller"

    def available_memory(self, device: Device, ranks_on_host: int = 1) -> int | None:
        """host_available_memory() (MemAvailable, capped by the cgroup memory limit's headroom), split
        evenly between the ranks that share the host (and its cgroup)."""
        avail = host_available_memory()
        return None if avail is None else avail // max(1, ranks_on_host)

    def device_count(self, device: Device) -> tuple[int, str]:
        """(CPUs this process may use: cgroup.usable_cpus, "CPU cores this process may use (<source>)")."""
        count, source = cgroup.usable_cpus()
        return count, f"CPU cores this process may use ({source})"

    def rank_devices(self, size: int, device: Device) -> list[Device]:
        count, what = self.device_count(device)
        if size > count:
            raise ValueError(f"tensor_parallel_size {size} exceeds the {count} {what}")
        return [Device.CPU] * size

    def collective_env(self, device: Device) -> dict[str, str]:
        return {"PADDLE_DISTRI_BACKEND": "gloo"}


class GcuPlatform(Platform):
    """An Enflame GCU through the paddle-custom-gcu plug-in (CustomDevice type "gcu"). The plug-in's
    version is checked on every activation; collectives go through Paddle's xccl backend over the
    plug-in's library (ECCL on a GCU; tested here only on the stand-in plug-in's collectives)."""

    kind = "gcu"

    def activate(self, device: Device, threads: int) -> None:
        import paddle

        check_gcu_versions()
        paddle.set_device(str(device))

    def available_memory(self, device: Device, ranks_on_host: int = 1) -> int | None:
        """Free bytes of this device (each rank has its own device): see memory_report."""
        return self.memory_report(device, ranks_on_host)[0]

    def memory_report(self, device: Device, ranks_on_host: int = 1) -> tuple[int | None, str]:
        """(free bytes of the device, where from): the TOPS runtime's topsMemGetInfo free figure
        (tops_runtime; memory of other processes on the device counted), else the plug-in's total
        memory minus what Paddle reserved in this process (device.gcu_available_memory), else None
        (the caller falls back to the explicit settings), the reason naming both attempts."""
        from paddle_llm_engine.platforms import tops_runtime

        info, where = tops_runtime.query(device.index)
        if info is not None:
            free, total = info
            return free, f"the TOPS runtime ({where}: {free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB)"
        avail = gcu_available_memory(str(device))
        if avail is not None:
            return avail, f"the plug-in's total memory minus Paddle's reserved (no TOPS runtime figure: {where})"
        return None, f"no TOPS runtime figure ({where}) and the plug-in reports no total memory"

    def device_count(self, device: Device) -> tuple[int, str]:
        import paddle

        found = [d for d in paddle.device.get_available_custom_device() if d.partition(":")[0] == device.kind]
        return len(found), f"{device.kind} devices the plug-in reports"

    def rank_devices(self, size: int, device: Device) -> list[Device]:
        count, what = self.device_count(device)
        first = device.index
        if first + size > count:
            raise ValueError(f"tensor_parallel_size {size} on {device.kind}:{first}..{device.kind}:{first + size - 1} "
                             f"exceeds the {count} {what}")
        return [Device(device.kind, first + r) for r in range(size)]

    def collective_env(self, device: Device) -> dict[str, str]:
        return {"PADDLE_DISTRI_BACKEND": "xccl", "PADDLE_XCCL_BACKEND": device.kind,
                f"FLAGS_selected_{device.kind}s": str(device.index)}


_PLATFORMS = {"cpu": CpuPlatform(), "gcu": GcuPlatform()}


def platform_for(device: Device | str) -> Platform:
    """The Platform of a device ("cpu", "gcu:<id>" or a Device). Raises ValueError for another kind."""
    kind = Device.parse(device).kind
    return _PLATFORMS[kind]
