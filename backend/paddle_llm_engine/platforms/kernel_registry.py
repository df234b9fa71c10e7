"""Which dtypes Paddle has kernels for, per op and per place, from Paddle's own kernel registry.

Start-up decisions (compute dtype, KV-cache dtype, fused kernels) are made from this table rather
than by calling an op and catching the "kernel not registered" error in the hot path.
"""

from __future__ import annotations

import functools
import re

from paddle_llm_engine.platforms.device import Device

_KEY = re.compile(r"\(\s*([^,]+?)\s*,\s*([^,]+?)\s*,\s*([^)]+?)\s*\)")


def _backend_name(device: Device | str) -> str:
    """Registry backend name of a device: "cpu" -> "CPU", "gcu:1" -> "gcu"."""
    kind = Device.parse(device).kind
    return "CPU" if kind == "cpu" else kind


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, tuple[tuple[str, str, str], ...]]:
    """op name -> ((backend, layout, dtype), ...) as Paddle registered them."""
    from paddle.base import core

    out = {}
    for name, keys in core._get_registered_phi_kernels("all").items():
        parsed = []
        for key in keys:
            m = _KEY.match(key)
            if m:
                parsed.append(m.groups())
        out[name] = tuple(parsed)
    return out


def _custom_operators() -> frozenset[str]:
    """Names of the custom operators loaded into this process so far (PD_BUILD_OP: a device
    plug-in's own ops, e.g. paddle-custom-gcu's fused MoE; they sit in Paddle's operator table, not
    the phi kernel registry, and take any dtype)."""
    from paddle.base import core

    return frozenset(core.get_all_op_names("fluid"))


class KernelRegistry:
    """Registered (op, device, dtype) triples. `kernels` overrides Paddle's table (tests give the
    table of a host they do not have): {op: [(backend, dtype), ...]} with backend as the registry
    names it ("CPU", "gcu", ...); `custom_ops` overrides the loaded custom operators' names."""

    def __init__(self, kernels: dict[str, list[tuple[str, str]]] | None = None,
                 custom_ops: set[str] | frozenset[str] | None = None):
        if kernels is None:
            kernels = {op: [(b, d) for b, _layout, d in keys] for op, keys in _registry().items()}
        self._kernels = {op: frozenset(v) for op, v in kernels.items()}
        self._custom_ops = frozenset(custom_ops) if custom_ops is not None else None

    def has_custom_op(self, name: str) -> bool:
        """True when a custom operator `name` is loaded (by a plug-in or an extension)."""
        ops = self._custom_ops if self._custom_ops is not None else _custom_operators()
        return name in ops

    def has(self, op: str, device: Device | str, dtype: str) -> bool:
        """True when `op` has a kernel for `dtype` ("float32", "bfloat16", ...) on `device`'s backend
        ("cpu", "gcu:0"). Kernels registered for all custom devices ("CUSTOM") count for a custom device."""
        backend = _backend_name(device)
        entries = self._kernels.get(op, frozenset())
        if (backend, dtype) in entries:
            return True
        return backend != "CPU" and ("CUSTOM", dtype) in entries

    def missing(self, ops, device: Device | str, dtype: str) -> list[str]:
        """The ops of `ops` with no kernel for `dtype` on `device`, in the order given."""
        return [op for op in ops if not self.has(op, device, dtype)]
