"""A Step (step.py) packed into the model's inputs on a worker's device.

Tokens are packed without padding in the step's order (decodes first, then prompt chunks); the
attention metadata carries each token's cache slot, and, whichever form the worker's OpSet reads
(OpSet.attention_metadata): for the decodes their context slots with an additive mask ("slots") or
their block tables and context lengths ("block_tables"), plus each prompt chunk's context slots;
or ("flash") every sequence's query offsets, key counts and block table for one varlen paged
attention call. Everything is computed on the host from the Step's plain ints and copied to the
device once per step (one tensor per field); nothing is read back from the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_engine.models.attention_metadata import AttentionMetadata, PrefillChunk
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
    """The ModelInputs of `step`. form: "slots", "block_tables" or "flash" (see the module docstring)."""
    if form == "flash":
        return _pack_flash(step, block_size)
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
    meta = AttentionMetadata(slot_mapping=from_numpy(np.concatenate(slot_parts)), num_decodes=len(decodes),
                             prefills=chunks)
    if decodes:
        _decode_metadata(meta, decodes, block_size, form)
    if form == "block_tables" and chunks:
        _row_metadata(meta, step, block_size)
    return ModelInputs(from_numpy(np.concatenate(ids)), from_numpy(np.concatenate(pos)), meta,
                       np.asarray(last_rows, dtype=np.int64))


# A step with prompt chunks gets per-row block tables (for a decoder that runs every row as a query
# over its own context, the CPU decode stack) only while that is cheap next to batched prefill
# attention: few prompt rows, short contexts. Past these, the prefill runs op by op.
ROW_TABLES_MAX_PROMPT_ROWS = 64
ROW_TABLES_MAX_CONTEXT = 1024


def _row_metadata(meta: AttentionMetadata, step: Step, block_size: int) -> None:
    """row_block_tables [T, max_blocks] int32 and row_context_lens [T] int32: row t of a sequence's
    rows at positions start .. start + n - 1 sees start + i + 1 keys through that sequence's table."""
    prompt_rows = sum(s.num_tokens for s in step.seqs if s.num_tokens > 1)
    longest = max(s.start + s.num_tokens for s in step.seqs)
    if prompt_rows > ROW_TABLES_MAX_PROMPT_ROWS or longest > ROW_TABLES_MAX_CONTEXT:
        return
    nblk = -(-longest // block_size)
    tables, lens = [], []
    for s in step.seqs:
        used = -(-(s.start + s.num_tokens) // block_size)
        row = np.zeros(nblk, dtype=np.int32)
        row[:used] = s.block_table[:used]
        tables.append(np.broadcast_to(row, (s.num_tokens, nblk)))
        lens.append(np.arange(s.start + 1, s.start + s.num_tokens + 1, dtype=np.int32))
    meta.row_block_tables = from_numpy(np.ascontiguousarray(np.concatenate(tables)))
    meta.row_context_lens = from_numpy(np.concatenate(lens))


def _decode_metadata(meta: AttentionMetadata, decodes, block_size: int, form: str) -> None:
    ctx = [s.start + 1 for s in decodes]
    if form == "block_tables":
        nblk = max(-(-c // block_size) for c in ctx)
        tables = np.zeros((len(decodes), nblk), dtype=np.int32)
        for i, (s, c) in enumerate(zip(decodes, ctx)):
            used = -(-c // block_size)
            tables[i, :used] = s.block_table[:used]
        meta.decode_block_tables = from_numpy(tables)
        meta.decode_context_lens = from_numpy(np.asarray(ctx, dtype=np.int32))
        return
    width = max(ctx)
    dslots = np.zeros((len(decodes), width), dtype=np.int64)
    mask = np.full((1, len(decodes), 1, width), -np.inf, dtype=np.float32)
    for i, (s, c) in enumerate(zip(decodes, ctx)):
        dslots[i, :c] = slots(s.block_table, 0, c, block_size)
        mask[0, i, 0, :c] = 0.0
    meta.decode_slots = from_numpy(dslots)
    meta.decode_mask = from_numpy(mask)


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
    meta = AttentionMetadata(slot_mapping=from_numpy(slot.astype(np.int32)),
                             num_decodes=int((n_new == 1).sum()), cu_seqlens_q=from_numpy(cu),
                             seqused_k=from_numpy(used.astype(np.int32)), block_table=from_numpy(table),
                             max_seqlen_q=int(n_new.max()), max_seqlen_k=int(used.max()))
    last = np.asarray([r for i, s in enumerate(seqs) if s.samples for r in range(cu[i + 1] - s.num_rows, cu[i + 1])],
                      dtype=np.int64)
    return ModelInputs(from_numpy(ids), from_numpy(pos), meta, last)
