"""A checkpoint reader that hands the model a rank's shard of each tensor (shard.py says which),
by tensor name, so that the model code loads a shard exactly as it loads the whole model."""

from __future__ import annotations

import numpy as np

from paddle_llm_engine.models.weights import CheckpointReader
from paddle_llm_engine.tp.shard import ShardPlan

_COLUMN = ("gate_proj.", "up_proj.")  # HF [out, in]: this rank's output rows
_ROW = ("down_proj.",)                # HF [out, in]: this rank's input columns


class ShardedReader:
    """get / linear / unread as CheckpointReader, each tensor cut to `plan`'s shard."""

    def __init__(self, reader: CheckpointReader, plan: ShardPlan):
        self.reader = reader
        self.plan = plan

    def unread(self) -> list[str]:
        return self.reader.unread()

    def linear(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self.get(name).T)

    def get(self, name: str) -> np.ndarray:
        w = self.reader.get(name)
        return np.ascontiguousarray(self._shard(name, w))

    def _once(self, w: np.ndarray) -> np.ndarray:
        """A row-parallel projection's bias: added by rank 0 only (the all_reduce sums the ranks)."""
        return w if self.plan.rank == 0 else np.zeros_like(w)

    def shard(self, name: str, w: np.ndarray) -> np.ndarray:
        """This rank's part of `w`, a tensor laid out like checkpoint tensor `name` (contiguous)."""
        return np.ascontiguousarray(self._shard(name, w))

    def _shard(self, name: str, w: np.ndarray) -> np.ndarray:
        p = self.plan
        leaf = name.rsplit(".", 2)
        kind = leaf[-1]  # weight / bias
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return w[p.vocab_start:p.vocab_end]
        if ".self_attn." in name:
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                return w[p.q_rows()]
            if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
                return w[p.kv_rows()]
            if name.endswith("o_proj.weight"):
                return w[:, p.q_rows()]
            if name.endswith("o_proj.bias"):
                return self._once(w)
            return w  # q_norm / k_norm: per head_dim, replicated
        if name.endswith("experts.gate_up_proj"):  # transformers 5 merged: [E, 2I, H], gate rows first
            i = w.shape[1] // 2
            s = p.part(i)
            return np.concatenate([w[:, s], w[:, i + s.start:i + s.stop]], axis=1)
        if name.endswith("experts.down_proj"):  # [E, H, I]
            return w[..., p.part(w.shape[-1])]
        stem = leaf[-2] + "." if len(leaf) > 1 else ""
        if stem in _COLUMN:
            return w[p.part(w.shape[0])]
        if stem in _ROW:
            return w[:, p.part(w.shape[1])] if kind == "weight" else self._once(w)
        return w  # norms, router, shared-expert gate, routing bias: replicated
