"""Any supported model class made tensor parallel for one rank: the weights come through a
ShardedReader, the token embedding is vocab-parallel (each rank looks up the ids of its rows, the
others give zeros, an all_reduce sums them), and every row-parallel output (o_proj, the MLP or
mixture of experts) is summed over the ranks with an all_reduce. compute_logits returns this
rank's vocabulary columns ([B, vocab_end - vocab_start]); the worker hands them to the engine
process, which assembles the full rows (no collective for the logits).

The model's config must already hold the rank's head counts (num_attention_heads /
num_key_value_heads of the shard), so that the forward and the KV cache are the shard's.
"""

from __future__ import annotations

import paddle

from paddle_llm_engine.models.registry import model_class
from paddle_llm_engine.tp.reader import ShardedReader
from paddle_llm_engine.tp.shard import ShardPlan


class TensorParallelMixin:
    """Put before a model class (build_tp_model does): its checkpoint reads, token embedding and
    row-parallel reductions become rank `shard.rank`'s."""

    shard: ShardPlan
    group = None  # paddle.distributed group; None: the default (world) group
    supports_decode_stack = False  # the decode stack has no all_reduce between its layers

    def open_checkpoint(self, model_dir: str):
        return ShardedReader(super().open_checkpoint(model_dir), self.shard)

    def shard_tensor(self, name, w):
        """Cut `w` as this rank's reader cuts checkpoint tensor `name`."""
        return ShardedReader(None, self.shard).shard(name, w)

    def embed_tokens(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        s = self.shard
        local = input_ids - s.vocab_start
        mine = paddle.logical_and(local >= 0, local < s.vocab_end - s.vocab_start)
        local = paddle.where(mine, local, paddle.zeros_like(local))
        h = paddle.index_select(self.embed, local, axis=0)
        return self.reduce_partial(h * mine.astype(h.dtype).unsqueeze(-1))

    def reduce_partial(self, x: paddle.Tensor) -> paddle.Tensor:
        import paddle.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x


_CLASSES: dict[type, type] = {}


def build_tp_model(cfg, ops, dtype: str, shard: ShardPlan):
    """The model object of `cfg.model_type` for rank `shard.rank` (weights not loaded). cfg: the
    shard's ModelConfig (its head counts)."""
    base = model_class(cfg)
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(f"TensorParallel{base.__name__}", (TensorParallelMixin, base), {})
    model = cls(cfg, ops, dtype)
    model.shard = shard
    return model
