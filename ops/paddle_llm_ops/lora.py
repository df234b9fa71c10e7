"""LoRA deltas for a batch whose rows use different adapters, from plain Paddle ops (every place
composes it the same way; the GCU runs the same matmul / index_select / concat).

The rows of each adapter are multiplied by its A then B together (the punica / S-LoRA grouping:
one pair of small matmuls per adapter in the step, not per row). Where each adapter's rows are one
contiguous range (a prompt chunk is), the ranges are sliced and the output is the concatenation of
the ranges, changed or not; otherwise the rows are gathered and the deltas put back in row order
with one gather over their concatenation plus a zero row for rows without an adapter.
"""

from __future__ import annotations

import paddle


def lora_apply(y: paddle.Tensor, x: paddle.Tensor, groups: list, gather: paddle.Tensor | None) -> paddle.Tensor:
    """y + the LoRA delta of every row.

    y: [T, out], the base linear's output; x: [T, in], its input (same dtype).
    groups: [(rows, A, B)]: rows [n] int64 (the rows using this adapter), a (start, stop) range of
    rows, or None (all T rows: the single group); A [in, r], B [r, out] in y's dtype with the
    adapter's scale folded into B. gather: with index rows, [T] int64, row t's index into the deltas
    concatenated in group order followed by one zero row; None with ranges or all rows.
    Returns [T, out]."""
    if gather is None:
        if groups[0][0] is None:
            _, a, b = groups[0]
            return y + paddle.matmul(paddle.matmul(x, a), b)
        parts, at = [], 0
        for (start, stop), a, b in sorted(groups, key=lambda g: g[0][0]):
            if start > at:
                parts.append(y[at:start])
            parts.append(y[start:stop] + paddle.matmul(paddle.matmul(x[start:stop], a), b))
            at = stop
        if at < y.shape[0]:
            parts.append(y[at:])
        return paddle.concat(parts, axis=0)
    deltas = [paddle.matmul(paddle.matmul(paddle.index_select(x, rows, axis=0), a), b) for rows, a, b in groups]
    deltas.append(paddle.zeros([1, y.shape[1]], dtype=y.dtype))
    return y + paddle.index_select(paddle.concat(deltas, axis=0), gather, axis=0)
