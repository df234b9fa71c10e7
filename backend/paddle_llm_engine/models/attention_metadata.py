"""Per-step metadata shared by all layers (the worker builds it once per step, worker/inputs.py).

Token order in a step: the decode tokens of `num_decodes` sequences first, then the prompt chunks
of the prefill sequences, packed without padding. Which fields are filled depends on the OpSet's
attention_metadata form ("slots", "block_tables" or "flash"); every tensor is on the step's device
and made once per step, never per layer.
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
    slot_mapping: paddle.Tensor                 # [T] cache slot of every new token (int64; int32 in "flash")
    num_decodes: int = 0
    decode_slots: paddle.Tensor | None = None   # [num_decodes, L] int64
    decode_mask: paddle.Tensor | None = None    # [1, num_decodes, 1, L] fp32 additive
    # The same decodes as block tables, for kernels that read the cache's blocks directly
    # (OpSet.attention_metadata "block_tables"); the worker fills one form or the other.
    decode_block_tables: paddle.Tensor | None = None  # [num_decodes, max_blocks] int32
    decode_context_lens: paddle.Tensor | None = None  # [num_decodes] int32 keys each decode sees
    prefills: list[PrefillChunk] = field(default_factory=list)  # "slots" / "block_tables" forms
    # "block_tables" form, steps with few prompt rows (worker/inputs.py): every row as one query over
    # its sequence's context, for a decoder that runs the whole step that way (the CPU decode stack)
    row_block_tables: paddle.Tensor | None = None  # [T, max_blocks] int32
    row_context_lens: paddle.Tensor | None = None  # [T] int32: keys row t sees, its own included
    # "flash" form (one varlen paged attention call over every sequence of the step, in step order):
    cu_seqlens_q: paddle.Tensor | None = None  # [b+1] int32: rows of sequence i are cu[i] .. cu[i+1]-1
    seqused_k: paddle.Tensor | None = None     # [b] int32 keys of sequence i, this step's included
    block_table: paddle.Tensor | None = None   # [b, max_blocks] int32, 0-padded
    max_seqlen_q: int = 0                      # host ints (kernel attributes), from the step's own data
    max_seqlen_k: int = 0
