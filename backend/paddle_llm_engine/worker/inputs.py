"""A Step (step.py) packed into the model's inputs on a worker's device.

Tokens are packed without padding in the step's order (decodes first, then prompt chunks); the
attention metadata (models/attention_metadata.py) carries each token's cache slot, and, in the form
the worker's OpSet reads (OpSet.attention_metadata): for the decodes their context slots with an
additive mask ("slots": SlotsMetadata) or their block tables and context lengths ("block_tables":
BlockTablesMetadata, RowTablesMetadata when every row also gets its own table), plus each prompt
chunk's context slots; or ("flash": FlashMetadata) every sequence's query offsets, key counts and
block table for one varlen paged attention call. Everything is computed on the host from the Step's plain ints and copied to the
device once per step (one tensor per field); nothing is read back from the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_engine.models.attention_metadata import (AttentionMetadata, BlockTablesMetadata, FlashMetadata,
                                                          PrefillChunk, RowTablesMetadata, SlotsMetadata)
from paddle_llm_engine.step import Step


@dataclass
class ModelInputs:
    """input_ids / positions: [T] int64 on the device; meta: the step's AttentionMetadata;
    last_rows: [num_sampled] int64 host array, the packed rows whose logits the step returns: each
        sampled entry's last token, or for an entry with draft tokens its last 1 + drafts tokens."""

    input_ids: paddle.Tensor
    positions: paddle.Tensor
    meta: AttentionMetadata
    last_rows: np.ndarray


def slots(block_table, start: int, end: int, block_size: int) -> np.ndarray:
    """Cache slots [end - start] int64 of positions start .. end - 1 of a sequence."""
    pos = np.arange(start, end, dtype=np.int64)
    bt = np.asarray(block_table, dtype=np.int64)
    return bt[pos // block_size] * block_size + pos % block_size


def pack_step(step: Step, block_size: int, form: str) -> ModelInputs:
    """The ModelInputs of `step`. form: "slots", "block_tables" or "flash" (see the module docstring):
    meta is a SlotsMetadata, a BlockTablesMetadata (a RowTablesMetadata for a step with few, short
    prompt rows) or a FlashMetadata. Raises ValueError for another form."""
    if form == "flash":
        return _pack_flash(step, block_size)
    if form not in ("slots", "block_tables"):
        raise ValueError(f"unknown attention metadata form {form!r} (slots, block_tables or flash)")
    ids, pos, slot_parts, last_rows, chunks = [], [], [], [], []
    row = 0
    for s in step.seqs:
        n, start = s.num_tokens, s.start
        ids.append(np.asarray(s.token_ids, dtype=np.int64))
        pos.append(np.arange(start, start + n, dtype=np.int64))
        slot_parts.append(slots(s.block_table, start, start + n, block_size))
        if n > 1:
            chunks.append(PrefillChunk(row, n, start, from_numpy(slots(s.block_table, 0, start + n, block_size))))
        if s.samples:
            last_rows.extend(range(row + n - s.num_rows, row + n))
        row += n
    decodes = [s for s in step.seqs if s.num_tokens == 1]
    slot_mapping = from_numpy(np.concatenate(slot_parts))
    if form == "slots":
        meta = SlotsMetadata(slot_mapping, len(decodes), *_decode_slots(decodes, block_size), prefills=chunks)
    else:
        tables = _decode_tables(decodes, block_size)
        rows = _row_tables(step, block_size) if chunks else None
        if rows is None:
            meta = BlockTablesMetadata(slot_mapping, len(decodes), *tables, prefills=chunks)
        else:
            meta = RowTablesMetadata(slot_mapping, len(decodes), *tables, chunks, *rows)
    return ModelInputs(from_numpy(np.concatenate(ids)), from_numpy(np.concatenate(pos)), meta,
                       np.asarray(last_rows, dtype=np.int64))


# A step with prompt chunks gets per-row block tables (for a decoder that runs every row as a query
# over its own context, the CPU decode stack) only while that is cheap next to batched prefill
# attention: few prompt rows, short contexts. Past these, the prefill runs op by op.
ROW_TABLES_MAX_PROMPT_ROWS = 64
ROW_TABLES_MAX_CONTEXT = 1024


def _row_tables(step: Step, block_size: int) -> tuple[paddle.Tensor, paddle.Tensor] | None:
    """(row_block_tables [T, max_blocks] int32, row_context_lens [T] int32), or None past the limits
    above: row t of a sequence's rows at positions start .. start + n - 1 sees start + i + 1 keys
    through that sequence's table."""
    prompt_rows = sum(s.num_tokens for s in step.seqs if s.num_tokens > 1)
    longest = max(s.start + s.num_tokens for s in step.seqs)
    if prompt_rows > ROW_TABLES_MAX_PROMPT_ROWS or longest > ROW_TABLES_MAX_CONTEXT:
        return None
    nblk = -(-longest // block_size)
    tables, lens = [], []
    for s in step.seqs:
        used = -(-(s.start + s.num_tokens) // block_size)
        row = np.zeros(nblk, dtype=np.int32)
        row[:used] = s.block_table[:used]
        tables.append(np.broadcast_to(row, (s.num_tokens, nblk)))
        lens.append(np.arange(s.start + 1, s.start + s.num_tokens + 1, dtype=np.int32))
    return from_numpy(np.ascontiguousarray(np.concatenate(tables))), from_numpy(np.concatenate(lens))


def _decode_tables(decodes, block_size: int) -> tuple[paddle.Tensor | None, paddle.Tensor | None]:
    """(decode_block_tables [B, max_blocks] int32, decode_context_lens [B] int32), (None, None) for B = 0."""
    if not decodes:
        return None, None
    ctx = [s.start + 1 for s in decodes]
    nblk = max(-(-c // block_size) for c in ctx)
    tables = np.zeros((len(decodes), nblk), dtype=np.int32)
    for i, (s, c) in enumerate(zip(decodes, ctx)):
        used = -(-c // block_size)
        tables[i, :used] = s.block_table[:used]
    return from_numpy(tables), from_numpy(np.asarray(ctx, dtype=np.int32))


def _decode_slots(decodes, block_size: int) -> tuple[paddle.Tensor | None, paddle.Tensor | None]:
    """(decode_slots [B, L] int64, decode_mask [1, B, 1, L] fp32 additive), (None, None) for B = 0."""
    if not decodes:
        return None, None
    ctx = [s.start + 1 for s in decodes]
    width = max(ctx)
    dslots = np.zeros((len(decodes), width), dtype=np.int64)
    mask = np.full((1, len(decodes), 1, width), -np.inf, dtype=np.float32)
    for i, (s, c) in enumerate(zip(decodes, ctx)):
        dslots[i, :c] = slots(s.block_table, 0, c, block_size)
        mask[0, i, 0, :c] = 0.0
    return from_numpy(dslots), from_numpy(mask)


def _pack_flash(step: Step, block_size: int) -> ModelInputs:
    """The "flash" form: int32 cu_seqlens_q [b+1], seqused_k [b], block_table [b, max_blocks]
    (0-padded past a sequence's last block) and slot_mapping [T], for every sequence of the step in
    step order (decodes, prefill chunks, prefix-cache hits alike: a sequence's first `start` keys
    are already cached)."""
    seqs = step.seqs
    n_new = np.asarray([s.num_tokens for s in seqs], dtype=np.int64)
    used = np.asarray([s.start + s.num_tokens for s in seqs], dtype=np.int64)
    nblk = -(-used // block_size)
    table = np.zeros((len(seqs), int(nblk.max())), dtype=np.int32)
    for i, s in enumerate(seqs):
        table[i, :nblk[i]] = s.block_table[:nblk[i]]
    ids = np.concatenate([np.asarray(s.token_ids, dtype=np.int64) for s in seqs])
    pos = np.concatenate([np.arange(s.start, s.start + s.num_tokens, dtype=np.int64) for s in seqs])
    row = np.repeat(np.arange(len(seqs)), n_new)  # the sequence of every packed token
    slot = table[row, pos // block_size].astype(np.int64) * block_size + pos % block_size
    cu = np.zeros(len(seqs) + 1, dtype=np.int32)
    cu[1:] = np.cumsum(n_new)
    meta = FlashMetadata(slot_mapping=from_numpy(slot.astype(np.int32)), num_decodes=int((n_new == 1).sum()),
                         cu_seqlens_q=from_numpy(cu), seqused_k=from_numpy(used.astype(np.int32)),
                         block_table=from_numpy(table), max_seqlen_q=int(n_new.max()),
                         max_seqlen_k=int(used.max()))
    last = np.asarray([r for i, s in enumerate(seqs) if s.samples for r in range(cu[i + 1] - s.num_rows, cu[i + 1])],
                      dtype=np.int64)
    return ModelInputs(from_numpy(ids), from_numpy(pos), meta, last)
