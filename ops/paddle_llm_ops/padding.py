"""Padding removal bookkeeping: the worker packs the tokens of all sequences into one [T, H] row
block (no padding); after the model, only the last token of each sampled sequence needs logits."""

import paddle


def gather_last_tokens(hidden: paddle.Tensor, last_token_index: paddle.Tensor) -> paddle.Tensor:
    """hidden: [T, H]; last_token_index: [B] int64 row indices into T. Returns [B, H]."""
    return paddle.index_select(hidden, last_token_index, axis=0)
