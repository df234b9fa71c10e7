"""Per-step metadata shared by all layers (the worker builds it once per step, worker/inputs.py).

Token order in a step: the decode tokens of `num_decodes` sequences first, then the prompt chunks
of the prefill sequences, packed without padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import paddle


@dataclass
class PrefillChunk:
    token_start: int      # first row of this chunk in the packed [T, ...] tensors
    num_tokens: int       # rows in this chunk
    start_pos: int        # position of the first row in its sequence
    context_slots: paddle.Tensor  # [start_pos + num_tokens] int64


@dataclass
class AttentionMetadata:
    slot_mapping: paddle.Tensor                 # [T] int64 cache slot of every new token
    num_decodes: int = 0
    decode_slots: paddle.Tensor | None = None   # [num_decodes, L] int64
    decode_mask: paddle.Tensor | None = None    # [1, num_decodes, 1, L] fp32 additive
    # The same decodes as block tables, for kernels that read the cache's blocks directly
    # (OpSet.decode_metadata "block_tables"); the worker fills one form or the other.
    decode_block_tables: paddle.Tensor | None = None  # [num_decodes, max_blocks] int32
    decode_context_lens: paddle.Tensor | None = None  # [num_decodes] int32 keys each decode sees
    prefills: list[PrefillChunk] = field(default_factory=list)
