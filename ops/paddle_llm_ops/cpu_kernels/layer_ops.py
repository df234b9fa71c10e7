"""The C++ CPU kernels of a decoder layer besides its linears: RMSNorm (with the fused residual
add), SwiGLU, rotary + paged KV write, paged decode and prefill attention. See the package docstring for
dispatch, threads and errors."""

from __future__ import annotations

import paddle

from paddle_llm_ops.cpu_kernels import _resolve, _run


def swiglu(x: paddle.Tensor, isa: str = "generic") -> paddle.Tensor:
    """SwiGLU of a fused gate_up output: x [B, 2I] fp32 (gate columns first) -> silu(x[:, :I]) * x[:, I:]
    [B, I] fp32, silu(g) = g / (1 + exp(-g)) (Shazeer 2020). avx2_fma / avx512_vnni evaluate exp with
    a polynomial (Cephes expf, within 2 ulp of it), generic with std::exp: the engine's op-by-op path
    and its decode stack call the same code, so both give the same bits. Raises ValueError on a wrong
    dtype, rank or an odd width."""
    return _run("plk_swiglu", x, _resolve(isa))[0]


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float, isa: str = "generic") -> paddle.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight. x: [T, H] fp32, weight: [H]. Returns [T, H].
    Also serves per-head norms (Qwen3 q/k norm) with x reshaped to [T * heads, head_dim]."""
    return _run("plk_rms_norm", x, weight, float(eps), _resolve(isa))[0]


def add_rms_norm(x: paddle.Tensor, residual: paddle.Tensor, weight: paddle.Tensor, eps: float,
                 isa: str = "generic") -> tuple[paddle.Tensor, paddle.Tensor]:
    """s = x + residual; returns (rms_norm(s, weight, eps), s), both [T, H] fp32, in one pass.
    Replaces `h = h + delta; x = rms_norm(h, w, eps)` of the decoder (s is the new residual h)."""
    y, s = _run("plk_add_rms_norm", x, residual, weight, float(eps), _resolve(isa))
    return y, s


def rotary_kv_write(qkv: paddle.Tensor, positions: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor,
                    k_cache: paddle.Tensor, v_cache: paddle.Tensor, slot_mapping: paddle.Tensor, num_heads: int,
                    num_kv_heads: int, q_norm: paddle.Tensor | None = None, k_norm: paddle.Tensor | None = None,
                    eps: float = 1e-6, isa: str = "generic") -> paddle.Tensor:
    """Rotary embedding (rotate-half) of q and k plus the paged KV write, in one pass, no concat.

    qkv: [T, (num_heads + 2 * num_kv_heads) * d] fp32, the fused projection output (q heads, then
    k heads, then v heads); positions: [T] int64; cos, sin: [max_positions, d] fp32 as
    RotaryTable.cos / .sin build them; k_cache, v_cache: [num_kv_heads, num_slots, d], both float32,
    bfloat16 or float16, written in place at slot_mapping [T] int64 (rotated k, v bit-copied into an
    fp32 cache; rounded to nearest even into a 16-bit one); q_norm, k_norm: optional [d] fp32
    per-head RMSNorm weights applied before the rotation (Qwen3), both or neither, with eps.
    Returns the rotated q [T, num_heads, d]. Without q/k norms, q and the cache rows are
    bit-identical to apply_rotary + write_kv. Raises ValueError for a position outside the table or
    a slot outside the cache (checked before anything is written). Duplicate slots: the last token
    wins."""
    out = _run("plk_rotary_kv", qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, q_norm, k_norm,
               int(num_heads), int(num_kv_heads), float(eps), _resolve(isa))
    return out[0]


def paged_decode_attention(q: paddle.Tensor, k_cache: paddle.Tensor, v_cache: paddle.Tensor,
                           block_tables: paddle.Tensor, context_lens: paddle.Tensor, scale: float, block_size: int,
                           isa: str = "generic") -> paddle.Tensor:
    """Decode attention reading K/V straight from each sequence's blocks.

    q: [B, num_heads, d] fp32 (one new token per sequence, already rotated and its k/v already in
    the cache); k_cache, v_cache: [num_kv_heads, num_blocks * block_size, d], both float32, bfloat16
    or float16 (widened exactly to fp32 when read; all arithmetic fp32);
    block_tables: [B, max_blocks] int32 (entries past a sequence's last block are ignored);
    context_lens: [B] int32, the keys each query sees (positions 0 .. len-1; 0 gives a zero row).
    Query head h uses KV head h // (num_heads // num_kv_heads); scale is the score factor
    (1/sqrt(d)). Returns [B, num_heads * d] fp32. Softmax is online (running max), stable for any
    score range. Raises ValueError for a block id outside the cache or a length beyond the table."""
    return _run("plk_decode_attention", q, k_cache, v_cache, block_tables, context_lens, float(scale),
                int(block_size), _resolve(isa))[0]


def paged_prefill_attention(q: paddle.Tensor, k_cache: paddle.Tensor, v_cache: paddle.Tensor,
                            context_slots: paddle.Tensor, start_pos: int, scale: float,
                            isa: str = "generic") -> paddle.Tensor:
    """Causal attention of one sequence's chunk of new tokens over its whole context, read straight
    from the cache by slot (paged_attention.prefill_attention's contract, fused: no gathered K/V, no
    score matrix, no mask tensor).

    q: [n, num_heads, d] fp32, the queries of positions start_pos .. start_pos + n - 1 (their keys and
    values already in the cache); k_cache, v_cache: [num_kv_heads, slots, d], float32, bfloat16 or
    float16 (widened exactly to fp32 when read); context_slots: [start_pos + n] int64, the slot of
    every position 0 .. start_pos + n - 1. Query i sees positions 0 .. start_pos + i; head h uses KV
    head h // (num_heads // num_kv_heads). Returns [n, num_heads * d] fp32. Online softmax over
    sub-blocks of 64 positions (as paged_decode_attention), queries in blocks of 16 sharing each K/V
    read. Raises ValueError for a slot outside the cache or mismatched shapes / dtypes."""
    return _run("plk_prefill_attention", q, k_cache, v_cache, context_slots, int(start_pos), float(scale),
                _resolve(isa))[0]
