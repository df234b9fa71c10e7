"""The set of kernels one engine's model calls, chosen once at start by the platform layer.

The model never decides which kernel to run: it calls `ops.rms_norm(...)`, `ops.make_linear(...)`,
`ops.qkv_rotary_write(...)` and so on, and the platform plan builds the OpSet from its decisions
(paddle_llm_engine.platforms, PlatformPlan.opset). Three families of kernels fill it:
- composed: Paddle ops (plus Paddle's fused RMSNorm / the GCU plug-in's fused MoE where the
  platform layer verified them), on every place;
- cpu: the C++ CPU kernels of paddle_llm_ops.cpu_kernels (weight-streaming GEMV, int8 GEMV, fused
  rotary + paged KV write, paged decode attention over block tables, fused causal prefill attention
  over a chunk's slots, fused add + RMSNorm), on the CPU place only, with the dispatch path
  ("avx512_vnni" | "avx2_fma" | "generic") the platform layer chose from the CPU's flags. (Prefill
  attention was composed before: at 2,000 tokens its score matrices, mask and softmax took 2.3x the
  fused kernel's time.)
- gcu: paddle-custom-gcu's custom ops (paddle_llm_ops.gcu), each group only where the platform layer
  found it registered with the expected signature and numerically right on the device:
  gcu_attention (one flash_attn_var_len_gcu call per layer for the whole mixed step, KV writes
  through reshape_and_cache_flash_gcu, the cache in the paged "blocks" layout), gcu_rotary
  (fused_rotary_embedding_gcu), gcu_rms_norm (rms_norm_gcu, fused_add_rms_norm_op); the rest of the
  composed family stays.

Attention is one call per layer whatever the family: `ops.attention(q, k_cache, v_cache, meta, scale)`.
The composed and cpu families run the step's decodes as one batch and each prompt chunk on its own
inside it; the gcu family runs one flash_attn_var_len_gcu call.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import paddle
import paddle.nn.functional as F

from paddle_llm_ops.gcu import custom_ops as gcu_ops
from paddle_llm_ops.kv_cache import write_kv
from paddle_llm_ops.linear import ComposedLinear, GemvLinear, Int4Linear, Int8Linear
from paddle_llm_ops.lora import lora_apply
from paddle_llm_ops.moe import COMPOSED_MOE, FUSED_GCU_MOE, MoEKernel
from paddle_llm_ops.norm import rms_norm_composed, rms_norm_fused
from paddle_llm_ops.paged_attention import decode_attention, prefill_attention
from paddle_llm_ops.rotary import apply_rotary

QUANTIZATIONS = ("", "wint8", "wint4")
_BITS = {"wint8": 8, "wint4": 4}
_LINEAR_KIND = {"": "gemv", "wint8": "int8", "wint4": "int4"}


KV_LAYOUTS = ("heads_slots", "blocks")
ATTENTION_METADATA = ("slots", "block_tables", "flash")


@dataclass(frozen=True)
class RotaryInputs:
    """What one step's rotary needs, computed once per forward: positions [T] (int64; int32 for
    the gcu kernel), the full tables cos / sin [max_positions, d] (cpu kernel), their rows for the
    step, [T, 1, d] in the compute dtype (composed), and the gcu kernel's cos ‖ sin table
    [max_positions, d] in the compute dtype."""

    positions: paddle.Tensor
    table_cos: paddle.Tensor
    table_sin: paddle.Tensor
    cos: paddle.Tensor | None
    sin: paddle.Tensor | None
    cos_sin: paddle.Tensor | None = None


@dataclass(frozen=True)
class OpSet:
    """The kernels of one engine. Signatures (T tokens, H hidden, d head_dim):
    rms_norm(x [T, H], weight [H], eps) -> [T, H];
    add_rms_norm(delta [T, H], residual [T, H], weight, eps) -> (rms_norm(residual + delta), residual + delta);
    make_linear(w_in_out numpy [in, out] fp32, bias numpy [out] | None, dtype) -> lin(x [T, in]) -> [T, out]
        (lin.kind, lin.in_features, lin.out_features: how it stores its weights, linear.py);
    make_lm_head(weight [V, H] tensor) -> head(hidden [B, H]) -> logits [B, V];
    rotary_inputs(table: RotaryTable, positions [T], dtype) -> RotaryInputs;
    qkv_rotary_write(qkv [T, (nh+2kvh)d], rot, k_cache, v_cache, slot_mapping [T], nh, kvh, d,
        q_norm, k_norm, eps) -> q [T, nh, d] rotated (k rotated and v written into the caches);
    attention(q [T, nh, d], k_cache, v_cache, meta, scale) -> [T, nh*d]: causal attention of every
        token of the step over its sequence's cached context (meta: the step's AttentionMetadata);
    attention_metadata: the form of the step's metadata the worker builds once per step and
        `attention` reads: "slots" (decode_slots, decode_mask, prefill chunks' context slots),
        "block_tables" (decode_block_tables, decode_context_lens, prefill chunks; with per-row
        tables for steps with few short prompt rows) or "flash" (cu_seqlens_q, seqused_k,
        block_table, max_seqlen_q/k; slot_mapping int32);
    kv_layout: "heads_slots" (each cache [kvh, num_blocks * block_size, d]) or "blocks"
        ([num_blocks, block_size, kvh, d], the gcu kernels'); the worker allocates and copies by it;
    write_kv as in kv_cache.py; moe_experts: the mixture-of-experts expert kernel (moe.MoEKernel);
    moe_routing: None (the model's composed routing) or topk(gating [T, E], k, renormalize) ->
        (weights [T, k] fp32, ids [T, k] int32) for plain softmax top-k routing;
    swiglu(gate_up [T, 2I]) -> [T, I]: silu of the gate columns times the up columns;
    make_decode_stack: None, or (layers: [decode_stack.StackLayer], final_norm, hidden, intermediate,
        num_heads, num_kv_heads, head_dim, eps, scale) -> (DecodeStack | None, description): the
        whole decoder of a decode-only step in one call, bit-identical to these ops (cpu family);
    names: the kernel chosen for each op, for logs and tests."""

    rms_norm: Callable
    add_rms_norm: Callable
    make_linear: Callable
    make_lm_head: Callable
    rotary_inputs: Callable
    qkv_rotary_write: Callable
    write_kv: Callable
    attention: Callable
    attention_metadata: str
    names: tuple[tuple[str, str], ...]
    moe_experts: MoEKernel = COMPOSED_MOE
    kv_layout: str = "heads_slots"
    moe_routing: Callable | None = None
    swiglu: Callable = F.swiglu
    make_decode_stack: Callable | None = None
    lora_apply: Callable = lora_apply


# ----------------------------------------------------------------------------- composed kernels
def _composed_add_rms_norm(rms_norm, delta, residual, weight, eps):
    h = residual + delta
    return rms_norm(h, weight, eps), h


def _composed_rotary_inputs(table, positions, dtype):
    cos, sin = table.lookup(positions)
    if dtype != "float32":
        cos, sin = cos.astype(dtype), sin.astype(dtype)
    return RotaryInputs(positions, table.cos, table.sin, cos, sin)


def _composed_rotary(q, k, rot):
    return apply_rotary(q, rot.cos, rot.sin), apply_rotary(k, rot.cos, rot.sin)


def _composed_qkv_rotary_write(rms_norm, write, qkv, rot, k_cache, v_cache, slot_mapping, nh, kvh, d,
                               q_norm=None, k_norm=None, eps=1e-6, rotary=_composed_rotary):
    """rotary(q [T, nh, d], k [T, kvh, d], rot) -> (q, k) rotated; write(k_cache, v_cache, k, v,
    slot_mapping) stores this step's keys and values."""
    t = qkv.shape[0]
    q, k, v = paddle.split(qkv, [nh * d, kvh * d, kvh * d], axis=-1)
    if q_norm is not None:  # per head, over head_dim (Qwen3), before rotary
        q = rms_norm(q.reshape([t * nh, d]), q_norm, eps)
        k = rms_norm(k.reshape([t * kvh, d]), k_norm, eps)
    q, k = rotary(q.reshape([t, nh, d]), k.reshape([t, kvh, d]), rot)
    write(k_cache, v_cache, k, v.reshape([t, kvh, d]), slot_mapping)
    return q


def _composed_decode(decode, q, k_cache, v_cache, meta, scale):
    return decode(q, k_cache, v_cache, meta.decode_slots, meta.decode_mask, scale)


def _split_attention(decode, prefill, q, k_cache, v_cache, meta, scale):
    """The step's decodes as one batch (decode(q [B, nh, d], k_cache, v_cache, meta, scale)), then
    each prompt chunk over its context slots (paged_attention.prefill_attention); [T, nh*d]."""
    parts = []
    nd = meta.num_decodes
    if nd:
        parts.append(decode(q[:nd], k_cache, v_cache, meta, scale))
    for c in meta.prefills:
        parts.append(prefill(q[c.token_start:c.token_start + c.num_tokens], k_cache, v_cache, c.context_slots,
                             c.start_pos, scale))
    return parts[0] if len(parts) == 1 else paddle.concat(parts, axis=0)


def _composed_lm_head(quantization, group_size, weight):
    if quantization:  # a quantized copy of the [V, H] head (as on the CPU): the embedding keeps its rows
        dtype = str(weight.dtype).replace("paddle.", "")
        return _composed_linear(quantization, group_size, weight.astype("float32").numpy().T, None, dtype)

    def head(hidden):
        return paddle.matmul(hidden, weight, transpose_y=True)
    return head


def _composed_linear(quantization, group_size, w_in_out, bias, dtype):
    if quantization:  # on a device: paddle-custom-gcu's linear_quant_gcu (the plan checked it)
        from paddle_llm_ops.gcu.linear_quant import GcuQuantLinear

        return GcuQuantLinear(w_in_out, bias, dtype, _BITS[quantization], group_size)
    return ComposedLinear(w_in_out, bias, dtype)


# ---------------------------------------------------------------------------------- cpu kernels
def _cpu_rms_norm(isa, x, weight, eps):
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.rms_norm(x, weight, eps, isa)


def _cpu_add_rms_norm(isa, delta, residual, weight, eps):
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.add_rms_norm(delta, residual, weight, eps, isa)


def _cpu_linear(isa, quantization, group_size, w8a8_prefill, w_in_out, bias, dtype):
    if quantization == "wint4":
        return Int4Linear(w_in_out, bias, isa, group_size)
    if quantization == "wint8":
        return Int8Linear(w_in_out, bias, isa, int8_prefill=w8a8_prefill)
    return GemvLinear(w_in_out, bias, isa)


def _cpu_lm_head(isa, quantization, group_size, w8a8_prefill, weight):
    from paddle_llm_ops import cpu_kernels

    if quantization:  # a quantized copy of the [V, H] head: the embedding lookup keeps fp32 rows
        return _cpu_linear(isa, quantization, group_size, w8a8_prefill, weight.numpy().T, None, "float32")
    return functools.partial(cpu_kernels.linear, w=weight, bias=None, isa=isa)


def _cpu_swiglu(isa, x):
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.swiglu(x, isa)


def _cpu_decode_stack(isa, block_size, layers, final_norm, hidden, intermediate, num_heads, num_kv_heads, head_dim,
                      eps, scale):
    from paddle_llm_ops.cpu_kernels.decode_stack import DecodeStack

    return DecodeStack.build(isa, block_size, layers, final_norm, hidden, intermediate, num_heads, num_kv_heads,
                             head_dim, eps, scale)


def _cpu_rotary_inputs(table, positions, dtype):
    return RotaryInputs(positions, table.cos, table.sin, None, None)


def _cpu_qkv_rotary_write(isa, qkv, rot, k_cache, v_cache, slot_mapping, nh, kvh, d, q_norm=None, k_norm=None,
                          eps=1e-6):
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.rotary_kv_write(qkv, rot.positions, rot.table_cos, rot.table_sin, k_cache, v_cache,
                                       slot_mapping, nh, kvh, q_norm, k_norm, eps, isa)


def _cpu_decode(isa, block_size, q, k_cache, v_cache, meta, scale):
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.paged_decode_attention(q, k_cache, v_cache, meta.decode_block_tables,
                                              meta.decode_context_lens, scale, block_size, isa)


def _cpu_prefill(isa, q, k_cache, v_cache, context_slots, start_pos, scale):
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.paged_prefill_attention(q, k_cache, v_cache, context_slots, start_pos, scale, isa)


# ---------------------------------------------------------------------------------- gcu kernels
def _gcu_rotary_inputs(table, positions, dtype):
    # positions [1, T] int32: the kernel's [batch, seq], made once per step
    return RotaryInputs(positions.astype("int32").reshape([1, -1]), table.cos, table.sin, None, None,
                        table.cos_sin_table(dtype))


def _gcu_rotary(q, k, rot):
    return gcu_ops.fused_rotary_embedding(q, k, rot.cos_sin, rot.positions)


def _gcu_write_kv(k_cache, v_cache, k, v, slot_mapping):
    gcu_ops.reshape_and_cache_flash(k, v, k_cache, v_cache, slot_mapping)


def _gcu_attention(q, k_cache, v_cache, meta, scale):
    return gcu_ops.flash_attn_var_len(q, k_cache, v_cache, meta, scale)


def _with_gcu_kernels(base: OpSet, gcu_attention: bool, gcu_rotary: bool, gcu_rms_norm: bool,
                      fused_moe: bool) -> OpSet:
    """The composed OpSet `base` with paddle-custom-gcu's ops where the platform layer turned them on."""
    names = dict(base.names)
    rms, add_rms = base.rms_norm, base.add_rms_norm
    if gcu_rms_norm:
        rms, add_rms = gcu_ops.rms_norm, gcu_ops.fused_add_rms_norm
        names["rms_norm"] = "rms_norm_gcu"
    rotary, rotary_inputs, write = _composed_rotary, base.rotary_inputs, write_kv
    attention, form, layout = base.attention, base.attention_metadata, base.kv_layout
    if gcu_rotary:
        rotary, rotary_inputs = _gcu_rotary, _gcu_rotary_inputs
    if gcu_attention:
        write, attention, form, layout = _gcu_write_kv, _gcu_attention, "flash", "blocks"
        names["attention"], names["kv_gather"] = "flash_attn_var_len_gcu", "none (paged kernel)"
    if gcu_rotary or gcu_attention:
        names["rotary_kv_write"] = (f"{'fused_rotary_embedding_gcu' if gcu_rotary else 'composed'} + "
                                    f"{'reshape_and_cache_flash_gcu' if gcu_attention else 'composed'}")
    if fused_moe:
        names["moe_routing"] = "topk_softmax_gcu (plain softmax top-k families)"
    return OpSet(
        rms_norm=rms, add_rms_norm=add_rms, make_linear=base.make_linear, make_lm_head=base.make_lm_head,
        rotary_inputs=rotary_inputs,
        qkv_rotary_write=functools.partial(_composed_qkv_rotary_write, rms, write, rotary=rotary),
        write_kv=write, attention=attention, attention_metadata=form, kv_layout=layout,
        names=tuple(names.items()), moe_experts=base.moe_experts,
        moe_routing=gcu_ops.topk_softmax if fused_moe else None,
    )


def build_opset(fused_rms_norm: bool = False, kv_gather_dtype: str | None = None, fused_moe: bool = False,
                cpu_isa: str | None = None, quantization: str = "", block_size: int = 0,
                gcu_attention: bool = False, gcu_rotary: bool = False, gcu_rms_norm: bool = False,
                quantization_group_size: int = -1, w8a8_prefill: bool = False) -> OpSet:
    """The OpSet for a platform plan's choices (the flags fused_rms_norm ... gcu_rms_norm are named
    as the plan's optional kernels).

    fused_rms_norm: Paddle's fused kernel (only where the platform layer verified it can run);
    kv_gather_dtype: see kv_cache.gather_kv (None: the cache's own dtype; the composed attention's
    only: the C++ CPU kernels read every cache dtype in place); fused_moe: the GCU
    plug-in's fused MoE operators (and its topk_softmax_gcu routing where a family routes by plain
    softmax top-k); cpu_isa: None (composed kernels) or the dispatch path of the C++ CPU kernels
    ("avx2_fma" | "generic": fp32 compute and an fp32 KV cache only); quantization: "", "wint8" or
    "wint4" (weight-only linears and LM head: the C++ int8 / int4 GEMV with cpu kernels,
    paddle-custom-gcu's linear_quant_gcu otherwise), quantization_group_size: -1 (per output
    channel) or the group size (resolved by the platform plan); block_size: tokens per KV block (the
    CPU paged decode kernel; the CPU prefill kernel reads by slot); gcu_attention / gcu_rotary / gcu_rms_norm: paddle-custom-gcu's ops (see
    the module doc; never with cpu_isa); w8a8_prefill: wint8 linears on the avx512_vnni cpu kernels
    quantize the activations of steps of more than 64 rows to int8 too (the int8 GEMM), else those
    multiply fp32 activations by the dequantized weight (the platform plan decides).
    Raises ValueError for an unknown quantization, or cpu kernels mixed with gcu ones."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    prefill, decode = prefill_attention, decode_attention
    if kv_gather_dtype is not None:
        prefill = functools.partial(prefill_attention, gather_dtype=kv_gather_dtype)
        decode = functools.partial(decode_attention, gather_dtype=kv_gather_dtype)
    moe = FUSED_GCU_MOE if fused_moe else COMPOSED_MOE
    moe_name = ("moe_experts", "fused_gcu" if fused_moe else "composed")
    gcu = gcu_attention or gcu_rotary or gcu_rms_norm
    if cpu_isa is not None:
        if gcu:
            raise ValueError("build_opset: the C++ CPU kernels and the gcu kernels serve different places")
        return _cpu_opset(cpu_isa, (quantization, quantization_group_size, w8a8_prefill), block_size, moe, moe_name)
    rms = rms_norm_fused if fused_rms_norm else rms_norm_composed
    base = OpSet(
        rms_norm=rms,
        add_rms_norm=functools.partial(_composed_add_rms_norm, rms),
        make_linear=functools.partial(_composed_linear, quantization, quantization_group_size),
        make_lm_head=functools.partial(_composed_lm_head, quantization, quantization_group_size),
        rotary_inputs=_composed_rotary_inputs,
        qkv_rotary_write=functools.partial(_composed_qkv_rotary_write, rms, write_kv),
        write_kv=write_kv,
        attention=functools.partial(_split_attention, functools.partial(_composed_decode, decode), prefill),
        attention_metadata="slots",
        names=(("rms_norm", "fused" if fused_rms_norm else "composed"),
               ("linear", f"linear_quant_gcu_{quantization}" if quantization else "composed"),
               ("rotary_kv_write", "composed"), ("attention", "composed"),
               ("kv_gather", kv_gather_dtype or "cache dtype"), moe_name),
        moe_experts=moe,
    )
    return _with_gcu_kernels(base, gcu_attention, gcu_rotary, gcu_rms_norm, fused_moe) if gcu or fused_moe else base


def _cpu_opset(cpu_isa: str, quant: tuple[str, int, bool], block_size: int, moe, moe_name) -> OpSet:
    """quant: (quantization, group size, w8a8_prefill) of the linears."""
    if block_size <= 0:
        raise ValueError("build_opset: the cpu kernels need the KV block_size")
    decode = functools.partial(_cpu_decode, cpu_isa, block_size)
    prefill = functools.partial(_cpu_prefill, cpu_isa)  # reads every cache dtype itself: no gather
    return OpSet(
        rms_norm=functools.partial(_cpu_rms_norm, cpu_isa),
        add_rms_norm=functools.partial(_cpu_add_rms_norm, cpu_isa),
        make_linear=functools.partial(_cpu_linear, cpu_isa, *quant),
        make_lm_head=functools.partial(_cpu_lm_head, cpu_isa, *quant),
        rotary_inputs=_cpu_rotary_inputs,
        qkv_rotary_write=functools.partial(_cpu_qkv_rotary_write, cpu_isa),
        write_kv=write_kv,
        attention=functools.partial(_split_attention, decode, prefill),
        attention_metadata="block_tables",
        swiglu=functools.partial(_cpu_swiglu, cpu_isa),
        make_decode_stack=functools.partial(_cpu_decode_stack, cpu_isa, block_size),
        names=(("rms_norm", f"cpu_{cpu_isa}"), ("swiglu", f"cpu_{cpu_isa}"), ("linear", f"cpu_{_LINEAR_KIND[quant[0]]}_{cpu_isa}"),
               ("rotary_kv_write", f"cpu_{cpu_isa}"), ("attention", f"cpu_paged_{cpu_isa}"),
               ("kv_gather", "none (paged kernels)"), moe_name)
        + ((("wint8_prefill", "int8" if quant[2] else "fp32"),) if quant[0] == "wint8" else ()),
        moe_experts=moe,
    )


COMPOSED = build_opset()
