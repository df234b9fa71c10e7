"""Per-step tensor ops of the model runner, written in Paddle so they run on every place.

Each op calls Paddle APIs, so it runs where Paddle has kernels for the tensor's place: on a GCU host
the paddle-custom-gcu plug-in registers them for the "gcu" place. Where Paddle has a fused kernel
(e.g. fused_rms_norm), the op uses it when a kernel is registered for the place and falls back to
composed ops otherwise (see norm.py), so the plug-in's fused kernels are picked up without code of
ours naming the plug-in.
"""

from paddle_llm_ops.kv_cache import write_kv
from paddle_llm_ops.norm import rms_norm
from paddle_llm_ops.padding import gather_last_tokens
from paddle_llm_ops.paged_attention import decode_attention, prefill_attention
from paddle_llm_ops.rotary import RotaryTable, apply_rotary, interleaved_to_half_order

__all__ = [
    "RotaryTable",
    "apply_rotary",
    "decode_attention",
    "gather_last_tokens",
    "interleaved_to_half_order",
    "prefill_attention",
    "rms_norm",
    "write_kv",
]
