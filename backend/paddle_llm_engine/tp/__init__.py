"""Tensor parallelism of the model itself: which heads, rows and columns a rank holds (shard: the
ShardPlan and the start-up check of the head counts), a checkpoint reader that returns a rank's
shard of each tensor (reader), and the model classes made tensor parallel (model: vocab-parallel
embedding, all_reduce after the row-parallel projections).

The processes that run the ranks are the executor's (executor/tensor_parallel.py,
executor/tp_worker.py); nothing here imports the worker or the executor.
"""
