"""The set of kernels one engine's model calls, chosen once at start by the platform layer.

The model never decides which kernel to run: it calls `ops.rms_norm(...)`, `ops.make_linear(...)`,
`ops.qkv_rotary_write(...)` and so on, and the worker builds the OpSet from the platform plan
(paddle_llm_engine.platforms). Two families of kernels fill it:
- composed: Paddle ops (plus Paddle's fused RMSNorm / the GCU plug-in's fused MoE where the
  platform layer verified them), on every place;
- cpu: the C++ CPU kernels of paddle_llm_ops.cpu_kernels (weight-streaming GEMV, int8 GEMV, fused
  rotary + paged KV write, paged decode attention over block tables, fused add + RMSNorm), on the
  CPU place only, with the dispatch path ("avx2_fma" | "generic") the platform layer chose from the
  CPU's flags. Prefill attention stays composed (MKL batched matmuls are fast there).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import paddle

from paddle_llm_ops.kv_cache import write_kv
from paddle_llm_ops.linear import ComposedLinear, GemvLinear, Int8Linear, WeightOnlyInt8Linear
from paddle_llm_ops.moe import COMPOSED_MOE, FUSED_GCU_MOE, MoEKernel
from paddle_llm_ops.norm import rms_norm_composed, rms_norm_fused
from paddle_llm_ops.paged_attention import decode_attention, prefill_attention
from paddle_llm_ops.rotary import apply_rotary

QUANTIZATIONS = ("", "wint8")


@dataclass(frozen=True)
class RotaryInputs:
    """What one step's rotary needs, computed once per forward: positions [T] int64, the full
    tables cos / sin [max_positions, d] (cpu kernel), and their rows for the step, [T, 1, d] in the
    compute dtype (composed)."""

    positions: paddle.Tensor
    table_cos: paddle.Tensor
    table_sin: paddle.Tensor
    cos: paddle.Tensor | None
    sin: paddle.Tensor | None


@dataclass(frozen=True)
class OpSet:
    """The kernels of one engine. Signatures (T tokens, H hidden, d head_dim):
    rms_norm(x [T, H], weight [H], eps) -> [T, H];
    add_rms_norm(delta [T, H], residual [T, H], weight, eps) -> (rms_norm(residual + delta), residual + delta);
    make_linear(w_in_out numpy [in, out] fp32, bias numpy [out] | None, dtype) -> lin(x [T, in]) -> [T, out];
    make_lm_head(weight [V, H] tensor) -> head(hidden [B, H]) -> logits [B, V];
    rotary_inputs(table: RotaryTable, positions [T], dtype) -> RotaryInputs;
    qkv_rotary_write(qkv [T, (nh+2kvh)d], rot, k_cache, v_cache, slot_mapping [T], nh, kvh, d,
        q_norm, k_norm, eps) -> q [T, nh, d] rotated (k rotated and v written into the caches);
    decode_attention(q [B, nh, d], k_cache, v_cache, meta, scale) -> [B, nh*d] (meta: the step's
        AttentionMetadata; decode_metadata says which of its fields the worker must fill:
        "slots" (decode_slots, decode_mask) or "block_tables" (decode_block_tables, decode_context_lens));
    prefill_attention as in paged_attention.py; write_kv as in kv_cache.py;
    moe_experts: the mixture-of-experts expert kernel (moe.MoEKernel);
    names: the kernel chosen for each op, for logs and tests."""

    rms_norm: Callable
    add_rms_norm: Callable
    make_linear: Callable
    make_lm_head: Callable
    rotary_inputs: Callable
    qkv_rotary_write: Callable
    write_kv: Callable
    prefill_attention: Callable
    decode_attention: Callable
    decode_metadata: str
    names: tuple[tuple[str, str], ...]
    moe_experts: MoEKernel = COMPOSED_MOE


# ----------------------------------------------------------------------------- composed kernels
def _composed_add_rms_norm(rms_norm, delta, residual, weight, eps):
    h = residual + delta
    return rms_norm(h, weight, eps), h


def _composed_rotary_inputs(table, positions, dtype):
    cos, sin = table.lookup(positions)
    if dtype != "float32":
        cos, sin = cos.astype(dtype), sin.astype(dtype)
    return RotaryInputs(positions, table.cos, table.sin, cos, sin)


def _composed_qkv_rotary_write(rms_norm, write, qkv, rot, k_cache, v_cache, slot_mapping, nh, kvh, d,
                               q_norm=None, k_norm=None, eps=1e-6):
    t = qkv.shape[0]
    q, k, v = paddle.split(qkv, [nh * d, kvh * d, kvh * d], axis=-1)
    if q_norm is not None:  # per head, over head_dim (Qwen3)
        q = rms_norm(q.reshape([t * nh, d]), q_norm, eps)
        k = rms_norm(k.reshape([t * kvh, d]), k_norm, eps)
    q = apply_rotary(q.reshape([t, nh, d]), rot.cos, rot.sin)
    k = apply_rotary(k.reshape([t, kvh, d]), rot.cos, rot.sin)
    write(k_cache, v_cache, k, v.reshape([t, kvh, d]), slot_mapping)
    return q


def _composed_decode(decode, q, k_cache, v_cache, meta, scale):
    return decode(q, k_cache, v_cache, meta.decode_slots, meta.decode_mask, scale)


def _composed_lm_head(weight):
    def head(hidden):
        return paddle.matmul(hidden, weight, transpose_y=True)
    return head


def _composed_linear(quantization, w_in_out, bias, dtype):
    if quantization == "wint8":
        return WeightOnlyInt8Linear(w_in_out, bias, dtype)
    return ComposedLinear(w_in_out, bias, dtype)


# ---------------------------------------------------------------------------------- cpu kernels
def _cpu_rms_norm(isa, x, weight, eps):
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.rms_norm(x, weight, eps, isa)


def _cpu_add_rms_norm(isa, delta, residual, weight, eps):
    from paddle_llm_ops import cpu_kernels

    return cpu_kernels.add_rms_norm(delta, residual, weight, eps, isa)


def _cpu_linear(isa, quantization, w_in_out, bias, dtype):
    return Int8Linear(w_in_out, bias, isa) if quantization == "wint8" else GemvLinear(w_in_out, bias, isa)


def _cpu_lm_head(isa, quantization, weight):
    from paddle_llm_ops import cpu_kernels

    if quantization == "wint8":  # an int8 copy of the [V, H] head: the embedding lookup keeps fp32 rows
        lin = Int8Linear(weight.numpy().T, None, isa)
        return lin
    return functools.partial(cpu_kernels.linear, w=weight, bias=None, isa=isa)


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


def build_opset(fused_rms_norm: bool = False, kv_gather_dtype: str | None = None, fused_moe: bool = False,
                cpu_isa: str | None = None, quantization: str = "", block_size: int = 0) -> OpSet:
    """The OpSet for a platform plan's choices.

    fused_rms_norm: Paddle's fused kernel (only where the platform layer verified it can run);
    kv_gather_dtype: see kv_cache.gather_kv (None: the cache's own dtype); fused_moe: the GCU
    plug-in's fused MoE operators; cpu_isa: None (composed kernels) or the dispatch path of the C++
    CPU kernels ("avx2_fma" | "generic": fp32 compute and an fp32 KV cache only); quantization: ""
    or "wint8" (weight-only int8 linears: the int8 GEMV with cpu kernels, Paddle's
    weight_only_linear otherwise); block_size: tokens per KV block (the paged decode kernel).
    Raises ValueError for an unknown quantization."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    prefill, decode = prefill_attention, decode_attention
    if kv_gather_dtype is not None:
        prefill = functools.partial(prefill_attention, gather_dtype=kv_gather_dtype)
        decode = functools.partial(decode_attention, gather_dtype=kv_gather_dtype)
    moe = FUSED_GCU_MOE if fused_moe else COMPOSED_MOE
    moe_name = ("moe_experts", "fused_gcu" if fused_moe else "composed")
    if cpu_isa is not None:
        if block_size <= 0:
            raise ValueError("build_opset: the cpu kernels need the KV block_size")
        rms = functools.partial(_cpu_rms_norm, cpu_isa)
        return OpSet(
            rms_norm=rms,
            add_rms_norm=functools.partial(_cpu_add_rms_norm, cpu_isa),
            make_linear=functools.partial(_cpu_linear, cpu_isa, quantization),
            make_lm_head=functools.partial(_cpu_lm_head, cpu_isa, quantization),
            rotary_inputs=_cpu_rotary_inputs,
            qkv_rotary_write=functools.partial(_cpu_qkv_rotary_write, cpu_isa),
            write_kv=write_kv,
            prefill_attention=prefill,
            decode_attention=functools.partial(_cpu_decode, cpu_isa, block_size),
            decode_metadata="block_tables",
            names=(("rms_norm", f"cpu_{cpu_isa}"), ("linear", f"cpu_{'int8' if quantization else 'gemv'}_{cpu_isa}"),
                   ("rotary_kv_write", f"cpu_{cpu_isa}"), ("decode_attention", f"cpu_paged_{cpu_isa}"),
                   ("kv_gather", kv_gather_dtype or "cache dtype"), moe_name),
            moe_experts=moe,
        )
    rms = rms_norm_fused if fused_rms_norm else rms_norm_composed
    return OpSet(
        rms_norm=rms,
        add_rms_norm=functools.partial(_composed_add_rms_norm, rms),
        make_linear=functools.partial(_composed_linear, quantization),
        make_lm_head=_composed_lm_head,
        rotary_inputs=_composed_rotary_inputs,
        qkv_rotary_write=functools.partial(_composed_qkv_rotary_write, rms, write_kv),
        write_kv=write_kv,
        prefill_attention=prefill,
        decode_attention=functools.partial(_composed_decode, decode),
        decode_metadata="slots",
        names=(("rms_norm", "fused" if fused_rms_norm else "composed"),
               ("linear", "weight_only_linear" if quantization else "composed"),
               ("rotary_kv_write", "composed"), ("decode_attention", "composed"),
               ("kv_gather", kv_gather_dtype or "cache dtype"), moe_name),
        moe_experts=moe,
    )


COMPOSED = build_opset()
