"""Test stand-in of `paddle_custom_device.gcu.ops` (tests only; NOT an Enflame GCU).

tests/gcu_standin/build.py write_standin_package() copies this file to
`paddle_custom_device/gcu/ops/__init__.py`. Like the real wheel's generated `ops/__init__.py`, importing
it registers the custom ops of every *.so in CUSTOM_DEVICE_ROOT with Paddle
(`paddle.utils.cpp_extension.extension_utils.load_op_meta_info_and_register_op`): Paddle's
CustomDevice loading only runs a plug-in's InitPlugin, so until that call `_run_custom_op` answers
"Can't find <op> in Eager OpMetaInfoMap" (measured with paddle 3.3.1).

Wrappers carry the real wheel's names (its custom_ops_api.py plus FastDeploy's renames of the generated
`<op>_gcu` functions) and call `paddle.base.core.eager._run_custom_op` with the op's inputs then
attributes, in the registered order. The real wheel's signatures differ across versions; the engine
calls `_run_custom_op` directly, these exist for tests and for code written against the wheel.
"""

from __future__ import annotations

import glob
import os

from paddle.base import core

STANDIN = True


def load_lib() -> list[str]:
    """Register the ops of every .so in CUSTOM_DEVICE_ROOT (once per process); returns their names."""
    global _loaded
    if _loaded is None:
        from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

        names: list[str] = []
        root = os.environ.get("CUSTOM_DEVICE_ROOT") or ""
        for lib in sorted(glob.glob(os.path.join(root, "*.so"))) if root else []:
            names += load_op_meta_info_and_register_op(lib)
        _loaded = names
    return list(_loaded)


_loaded: list[str] | None = None


def flash_attn_var_len(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None,
                       leftpad_k=None, block_table=None, alibi_slopes=None, p_dropout=0.0, softmax_scale=None,
                       zero_tensors=False, is_causal=True, window_size_left=-1, window_size_right=-1, softcap=0.0,
                       return_softmax=False):
    """attention_out [total_q, H, D] of flash_attn_var_len_gcu (see standin_ops_flash.cc)."""
    if softmax_scale is None:
        softmax_scale = float(q.shape[-1]) ** -0.5
    return core.eager._run_custom_op(
        "flash_attn_var_len_gcu", q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table,
        alibi_slopes, int(max_seqlen_q), int(max_seqlen_k), float(p_dropout), float(softmax_scale),
        bool(zero_tensors), bool(is_causal), int(window_size_left), int(window_size_right), float(softcap),
        bool(return_softmax))[0]


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping):
    """Write key/value [T, kv_heads, D] into the paged caches at slot_mapping, in place.

    The real op's kernel takes its inputs positionally as (key_cache, value_cache, key, value,
    slot_mapping) although it declares (key, value, key_cache, value_cache, slot_mapping); this wrapper
    passes the kernel's order (a wrapper passing the declared order would corrupt data on a GCU)."""
    return core.eager._run_custom_op("reshape_and_cache_flash_gcu", key_cache, value_cache, key, value, slot_mapping)


def fused_rotary_embedding(query, key, cos_sin_table, positions, is_neox):
    """(query_out, key_out): query [B, S, H, D] and key rotated in place (and returned)."""
    return core.eager._run_custom_op("fused_rotary_embedding_gcu", query, key, cos_sin_table, positions,
                                     bool(is_neox))


def rms_norm(x, weight, epsilon):
    return core.eager._run_custom_op("rms_norm_gcu", x, weight, float(epsilon))[0]


def fused_add_rms_norm(x, residual, weight, epsilon):
    """(out, residual_out) with residual_out = x + residual and out = RMSNorm(residual_out) * weight."""
    out, residual_out = core.eager._run_custom_op("fused_add_rms_norm_op", x, residual, weight, float(epsilon))
    return out, residual_out


def linear_quant(input, qweight, scales, bias=None, group_size=-1):  # noqa: A002 - the wheel's name
    return core.eager._run_custom_op("linear_quant_gcu", input, qweight, scales, bias, int(group_size))[0]


def topk_softmax(topk_weights, topk_indices, token_expert_indices, gating_output, norm_topk_prob=False):
    return tuple(core.eager._run_custom_op("topk_softmax_gcu", topk_weights, topk_indices, token_expert_indices,
                                           gating_output, bool(norm_topk_prob)))


def moe_align_block_size(sorted_token_ids, experts_ids, num_tokens_post_pad, topk_ids, num_experts, block_size):
    return tuple(core.eager._run_custom_op("moe_align_block_size_gcu", sorted_token_ids, experts_ids,
                                           num_tokens_post_pad, topk_ids, int(num_experts), int(block_size)))


def fused_moe_kernel(C, A, B, topk_weights, topk_ids, sorted_token_ids, experts_ids, num_tokens_post_pad,
                     mul_routed_weight, topk, block_size, bias=None):
    return core.eager._run_custom_op("fused_moe_kernel_gcu", C, A, B, bias, topk_weights, topk_ids, sorted_token_ids,
                                     experts_ids, num_tokens_post_pad, bool(mul_routed_weight), int(topk),
                                     int(block_size))


def _round_half_away(a):
    import numpy as np

    return np.sign(a) * np.floor(np.abs(a) + 0.5)  # C's round(), which the real kernel uses


def weight_quantize_rtn(x, algo: str, group_size: int):
    """(qweight, scale) in the layout the real wheel's weight_quantize_rtn hands linear_quant_gcu.

    x [K, N] float. Modelled on the gcu `weight_quantize` phi kernel plus rearrange_for_w4a16, computed
    here in numpy (the stand-in registers no phi kernels: Paddle's CPU weight_quantize, which a gcu
    tensor would fall back to, permutes int4 rows for CUTLASS and is not this layout):
      "weight_only_int8" / "llm.int8": scale = max |x| / 127 per column (group_size -1) or per group of
        group_size rows ([ceil(K/g), N]), fp32; qweight int8 [N, K] = round(x / scale) clipped to +-127.
      "weight_only_int4": bound 7, scale in x's dtype; u = clip(round(x / scale), -7, 7) + 8, K padded
        to a multiple of 128 (u = 0 there) and packed per 128-row chunk c: byte [n, 64c + i] =
        u[128c + i, n] | u[128c + 64 + i, n] << 4; qweight uint8 [N, Kp/2].
    Rounding is half away from zero (C round). Returns tensors on x's place."""
    import numpy as np
    import paddle

    if group_size not in (-1, 64, 128):
        raise ValueError(f"group_size must be -1, 64 or 128, got {group_size}")
    if algo not in ("weight_only_int8", "weight_only_int4", "llm.int8"):
        raise ValueError(f"algo must be weight_only_int8, weight_only_int4 or llm.int8, got {algo!r}")
    bits = 4 if algo == "weight_only_int4" else 8
    w = x.astype("float32").cpu().numpy().astype(np.float64)
    k_dim, n_dim = w.shape
    g = k_dim if group_size < 0 else group_size
    groups = -(-k_dim // g)
    bound = 7.0 if bits == 4 else 127.0
    scale = np.stack([np.abs(w[i * g:(i + 1) * g]).max(axis=0) for i in range(groups)]).astype(np.float32) / bound
    q = _round_half_away(w / np.repeat(scale.astype(np.float64), g, axis=0)[:k_dim])
    q = np.clip(np.nan_to_num(q), -bound, bound)
    if bits == 8:
        qweight = np.ascontiguousarray(q.T).astype(np.int8)
    else:
        kp = -(-k_dim // 128) * 128
        u = np.zeros((kp, n_dim), np.uint8)
        u[:k_dim] = (q + 8).astype(np.uint8)
        chunks = u.reshape(kp // 128, 2, 64, n_dim)
        qweight = np.ascontiguousarray((chunks[:, 0] | (chunks[:, 1] << 4)).reshape(kp // 2, n_dim).T)
    scale = scale[0] if group_size < 0 else scale
    scale_t = paddle.to_tensor(scale, place=x.place)
    if bits == 4:
        scale_t = scale_t.astype(x.dtype)
    return paddle.to_tensor(qweight, place=x.place), scale_t


load_lib()
