"""Per-step tensor ops of the engine's workers, written in Paddle so they run on every place.

Each op calls Paddle APIs, so it runs where Paddle has kernels for the tensor's place: on a GCU host
the paddle-custom-gcu plug-in registers them for the "gcu" place. Optional fused kernels (Paddle's
fused_rms_norm) sit beside the composed ops with the same signature; an engine's OpSet (opset.py)
names the ones its place can run, as the platform layer decided at start.
"""

from paddle_llm_ops.kv_cache import copy_blocks, gather_kv, write_kv
from paddle_llm_ops.norm import rms_norm, rms_norm_composed, rms_norm_fused
from paddle_llm_ops.opset import COMPOSED, OpSet, build_opset
from paddle_llm_ops.padding import gather_last_tokens
from paddle_llm_ops.paged_attention import decode_attention, prefill_attention
from paddle_llm_ops.rotary import RotaryTable, apply_rotary, interleaved_to_half_order

__all__ = [
    "COMPOSED",
    "copy_blocks",
    "OpSet",
    "build_opset",
    "gather_kv",
    "rms_norm_composed",
    "rms_norm_fused",
    "RotaryTable",
    "apply_rotary",
    "decode_attention",
    "gather_last_tokens",
    "interleaved_to_half_order",
    "prefill_attention",
    "rms_norm",
    "write_kv",
]
