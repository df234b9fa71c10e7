"""The set of kernels one engine's model calls, chosen once at start by the platform layer.

The model never decides which kernel to run: it calls `ops.rms_norm(...)`, `ops.write_kv(...)` and
so on, and the runner builds the OpSet from the platform plan (paddle_llm_engine.platforms). Every
field has the signature of the composed op of the same name in this package.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from paddle_llm_ops.kv_cache import write_kv
from paddle_llm_ops.moe import COMPOSED_MOE, FUSED_GCU_MOE, MoEKernel
from paddle_llm_ops.norm import rms_norm_composed, rms_norm_fused
from paddle_llm_ops.paged_attention import decode_attention, prefill_attention


@dataclass(frozen=True)
class OpSet:
    """rms_norm(x [T, H], weight [H], eps) -> [T, H]; write_kv(k_cache, v_cache, k, v, slot_mapping);
    prefill_attention / decode_attention as in paged_attention.py (the cache gather dtype bound);
    names: the kernel chosen for each op, for logs and tests; moe_experts: the mixture-of-experts
    expert kernel (moe.MoEKernel: packs a layer's expert weights at load, runs them per step)."""

    rms_norm: Callable
    write_kv: Callable
    prefill_attention: Callable
    decode_attention: Callable
    names: tuple[tuple[str, str], ...]
    moe_experts: MoEKernel = COMPOSED_MOE


def build_opset(fused_rms_norm: bool = False, kv_gather_dtype: str | None = None, fused_moe: bool = False) -> OpSet:
    """The OpSet for a platform plan's choices. fused_rms_norm: Paddle's fused kernel (only where the
    platform layer verified it can run); kv_gather_dtype: see kv_cache.gather_kv (None: the cache's
    own dtype); fused_moe: the GCU plug-in's fused MoE operators (only where the plug-in registers
    them)."""
    prefill, decode = prefill_attention, decode_attention
    if kv_gather_dtype is not None:
        prefill = functools.partial(prefill_attention, gather_dtype=kv_gather_dtype)
        decode = functools.partial(decode_attention, gather_dtype=kv_gather_dtype)
    return OpSet(
        rms_norm=rms_norm_fused if fused_rms_norm else rms_norm_composed,
        write_kv=write_kv,
        prefill_attention=prefill,
        decode_attention=decode,
        names=(("rms_norm", "fused" if fused_rms_norm else "composed"),
               ("kv_gather", kv_gather_dtype or "cache dtype"),
               ("moe_experts", "fused_gcu" if fused_moe else "composed")),
        moe_experts=FUSED_GCU_MOE if fused_moe else COMPOSED_MOE,
    )


COMPOSED = build_opset()
