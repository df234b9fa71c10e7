"""Per-step tensor ops of the model runner, written in Paddle so they run on every place.

Each op has a pure-Paddle implementation; `dispatch.fused_op(name)` returns the GCU plug-in's
fused kernel instead where `paddle-custom-gcu` is installed and provides it.
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
