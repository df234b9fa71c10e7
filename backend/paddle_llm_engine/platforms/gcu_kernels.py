"""The platform layer's decisions about paddle-custom-gcu's fast custom ops (Enflame GCU), as pure
functions of a place's facts (plan.PlaceFacts), called by plan.decide().

A group of ops (one optional kernel of the plan) is a candidate only when (1) the plug-in registers
every op of it (KernelRegistry.has_custom_op) and (2) each op's registered signature equals one the
engine calls correctly (facts.op_signatures, from paddle_llm_ops.gcu.signatures.compare, gathered
at start by process_plan.gather_facts); decide() then (3) runs its numerical check against the
composed ops (kernel_checks) before turning it on. Any of the three failing leaves the composed ops in place and
the decision line says which and why (naming both signatures for a mismatch). Nothing raises.

Kernels:
- gcu_attention: flash_attn_var_len_gcu + reshape_and_cache_flash_gcu as ONE unit (the KV cache
  is in their paged [num_blocks, block_size, kv_heads, head_dim] layout or in ours, never both);
- gcu_rotary: fused_rotary_embedding_gcu (is_neox always: interleaved models are permuted at load);
- gcu_rms_norm: rms_norm_gcu + fused_add_rms_norm_op;
- fused_moe: topk_softmax_gcu (routing of the plain softmax top-k families), moe_align_block_size_gcu,
  fused_moe_kernel_gcu.
"""

from __future__ import annotations

GCU_ATTENTION_OPS = ("flash_attn_var_len_gcu", "reshape_and_cache_flash_gcu")
GCU_ROTARY_OPS = ("fused_rotary_embedding_gcu",)
GCU_RMS_NORM_OPS = ("rms_norm_gcu", "fused_add_rms_norm_op")
FUSED_MOE_OPS = ("topk_softmax_gcu", "moe_align_block_size_gcu", "fused_moe_kernel_gcu")
GCU_KERNEL_OPS = {"gcu_attention": GCU_ATTENTION_OPS, "gcu_rotary": GCU_ROTARY_OPS,
                  "gcu_rms_norm": GCU_RMS_NORM_OPS, "fused_moe": FUSED_MOE_OPS}
# Every custom op whose signature gather_facts reads on a GCU place (linear_quant_gcu: quantization
# wint8 / wint4, decided by plan_quantization.decide_quantization).
SIGNATURE_OPS = tuple(op for ops in GCU_KERNEL_OPS.values() for op in ops) + ("linear_quant_gcu",)


def plugin_ops(facts, ops) -> tuple[bool, str]:
    """(every op of `ops` is registered on facts' plug-in with an expected signature, reason)."""
    kind = facts.device.kind
    missing = [op for op in ops if not facts.registry.has_custom_op(op)]
    if missing:
        return False, f"the {kind} plug-in registers no {', '.join(missing)}"
    bad = []
    for op in ops:
        ok, detail = facts.op_signatures.get(op, (False, f"{op}: signature not read"))
        if not ok:
            bad.append(detail)
    if bad:
        return False, "; ".join(bad)
    return True, f"the {kind} plug-in registers {', '.join(ops)} with the expected signatures"


def gcu_attention(facts, dtype: str, kv_cache_dtype: str) -> tuple[bool, str]:
    """(can run, reason) for the paged flash attention + KV write pair."""
    if facts.device.kind == "cpu":
        return False, "paddle-custom-gcu's attention serves a gcu place only"
    if kv_cache_dtype != dtype:
        return False, (f"flash_attn_var_len_gcu reads the cache in the compute dtype; kv_cache_dtype "
                       f"{kv_cache_dtype} differs from dtype {dtype}")
    ok, reason = plugin_ops(facts, GCU_ATTENTION_OPS)
    if not ok:
        return False, f"{reason}; the composed attention over the [kv_heads, slots, head_dim] cache runs"
    return True, f"{reason}; one call per layer, KV cache paged [num_blocks, block_size, kv_heads, head_dim]"


def gcu_rotary(facts) -> tuple[bool, str]:
    """(can run, reason) for fused_rotary_embedding_gcu."""
    if facts.device.kind == "cpu":
        return False, "paddle-custom-gcu's rotary serves a gcu place only"
    return plugin_ops(facts, GCU_ROTARY_OPS)


def gcu_rms_norm(facts) -> tuple[bool, str]:
    """(can run, reason) for rms_norm_gcu + fused_add_rms_norm_op."""
    if facts.device.kind == "cpu":
        return False, "paddle-custom-gcu's RMSNorm serves a gcu place only"
    return plugin_ops(facts, GCU_RMS_NORM_OPS)


def fused_moe(facts) -> tuple[bool, str]:
    """(can run, reason) for the GCU MoE trio (FUSED_MOE_OPS)."""
    if facts.device.kind == "cpu":
        return False, "Paddle has no fused MoE kernel for the CPU; the experts run as grouped matmuls"
    return plugin_ops(facts, FUSED_MOE_OPS)


def fused_rms_norm_on_plugin(facts) -> tuple[bool, str]:
    """Paddle's incubate fused_rms_norm (phi `rms_norm`, registered as fused_rms_norm_quant) on a
    plug-in place: never. paddle-custom-gcu registers it as a stub that allocates its output and
    computes nothing (backends/gcu/kernels/llama_stub_kernels.cc)."""
    kind = facts.device.kind
    return False, (f"never on a {kind}: paddle-custom-gcu registers Paddle's rms_norm / fused_rms_norm as a stub "
                   f"that computes nothing (llama_stub_kernels.cc); gcu_rms_norm is its RMSNorm")


def load_plugin_ops() -> str:
    """Register the plug-in's custom ops with Paddle by importing `paddle_custom_device.gcu.ops`, as
    the wheel's users do (Paddle's CustomDevice loading runs only the plug-in's InitPlugin; the ops
    module calls load_op_meta_info_and_register_op on its libraries). Returns "" or why not; never raises."""
    import importlib

    try:
        importlib.import_module("paddle_custom_device.gcu.ops")
        return ""
    except Exception as e:  # no ops module in this wheel, or it failed: its ops count as not registered
        return f"paddle_custom_device.gcu.ops not loaded ({type(e).__name__}: {str(e).splitlines()[0][:200]})"


def gather_signatures(device_kind: str) -> dict[str, tuple[bool, str]]:
    """{op: (signature ok, detail)} of SIGNATURE_OPS on this process's plug-in (empty on the CPU),
    after registering the plug-in's ops (load_plugin_ops). Never raises: an op that cannot be read
    is (False, why)."""
    if device_kind == "cpu":
        return {}
    note = load_plugin_ops()
    try:
        from paddle_llm_ops.gcu.signatures import compare_all

        found = compare_all(SIGNATURE_OPS)
    except Exception as e:  # unreadable registry: every op counts as mismatched, with the reason
        return {op: (False, f"{op}: signature not readable ({type(e).__name__}: {e})") for op in SIGNATURE_OPS}
    if note:
        found = {op: (ok, detail if ok else f"{detail} ({note})") for op, (ok, detail) in found.items()}
    return found
