"""Tensor parallel inside one engine: N worker processes, one per device, each holding a shard of
the weights and of the KV cache; the engine process (scheduler, sampler, detokenizer) feeds them
step by step and samples once from the gathered logits.

Modules: shard (which heads / rows / columns a rank holds, the start-up checks), reader (a
checkpoint reader that returns a rank's shard of each tensor), model (the model classes made
tensor parallel: vocab-parallel embedding, all_reduce after the row-parallel projections),
channel (the per-step messages and the shared logits buffer), worker (the worker process),
runner (the engine-side runner that starts, feeds and watches the workers).
"""
