"""Per-step attention metadata shared by all layers (the worker builds it once per step,
worker/inputs.py): one type per form the OpSet's attention reads (OpSet.attention_metadata), each
with the fields that form needs.

- SlotsMetadata ("slots": the composed kernels): the decodes' context slots with an additive mask,
  each prompt chunk's context slots;
- BlockTablesMetadata ("block_tables": the C++ CPU kernels): the decodes' block tables and context
  lengths, each prompt chunk's context slots;
- RowTablesMetadata: a BlockTablesMetadata whose step also gives every row its own block table and
  context length (steps with few, short prompt rows, among them speculation's verify rows), for a
  decoder that runs every row as one query over its context (the CPU decode stack);
- FlashMetadata ("flash": the gcu kernels): every sequence's query offsets, key counts and block
  table for one varlen paged attention call.

Token order in a step: the decode tokens of `num_decodes` sequences first, then the prompt chunks
of the prefill sequences, packed without padding. Every tensor is on the step's device and made
once per step, never per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import paddle


@dataclass
class PrefillChunk:
    """One sequence's prompt rows of a step (or its verify rows under speculation), for the
    "slots" and "block_tables" forms."""

    token_start: int      # first row of this chunk in the packed [T, ...] tensors
    num_tokens: int       # rows in this chunk
    start_pos: int        # position of the first row in its sequence
    context_slots: paddle.Tensor  # [start_pos + num_tokens] int64


@dataclass
class SlotsMetadata:
    """The "slots" form: decodes read their context through decode_slots (None without decodes)."""

    slot_mapping: paddle.Tensor                 # [T] int64 cache slot of every new token
    num_decodes: int = 0
    decode_slots: paddle.Tensor | None = None   # [num_decodes, L] int64
    decode_mask: paddle.Tensor | None = None    # [1, num_decodes, 1, L] fp32 additive
    prefills: list[PrefillChunk] = field(default_factory=list)


@dataclass
class BlockTablesMetadata:
    """The "block_tables" form: kernels that read the cache's blocks directly (None without decodes)."""

    slot_mapping: paddle.Tensor                       # [T] int64 cache slot of every new token
    num_decodes: int = 0
    decode_block_tables: paddle.Tensor | None = None  # [num_decodes, max_blocks] int32
    decode_context_lens: paddle.Tensor | None = None  # [num_decodes] int32 keys each decode sees
    prefills: list[PrefillChunk] = field(default_factory=list)


@dataclass
class RowTablesMetadata(BlockTablesMetadata):
    """A "block_tables" step with prompt chunks whose every row also comes as one query over its
    sequence's context (row t at position p sees p + 1 keys, its own included). Both row fields are
    required (they come last only because the inherited fields have defaults): ValueError without."""

    row_block_tables: paddle.Tensor | None = None  # [T, max_blocks] int32
    row_context_lens: paddle.Tensor | None = None  # [T] int32

    def __post_init__(self):
        if self.row_block_tables is None or self.row_context_lens is None:
            raise ValueError("RowTablesMetadata needs row_block_tables and row_context_lens")


@dataclass
class FlashMetadata:
    """The "flash" form: one varlen paged attention call over every sequence of the step, in step
    order (decodes, prompt chunks, prefix-cache hits alike)."""

    slot_mapping: paddle.Tensor  # [T] int32 cache slot of every new token
    num_decodes: int
    cu_seqlens_q: paddle.Tensor  # [b+1] int32: rows of sequence i are cu[i] .. cu[i+1]-1
    seqused_k: paddle.Tensor     # [b] int32 keys of sequence i, this step's included
    block_table: paddle.Tensor   # [b, max_blocks] int32, 0-padded
    max_seqlen_q: int            # host ints (kernel attributes), from the step's own data
    max_seqlen_k: int


AttentionMetadata = Union[SlotsMetadata, BlockTablesMetadata, RowTablesMetadata, FlashMetadata]
