"""Load a model folder's tokenizer (tokenizer.json + tokenizer_config.json) through paddleformers."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=4)
def load_tokenizer(model_dir: str):
    """The paddleformers AutoTokenizer of `model_dir`, offline; cached per folder."""
    from paddleformers.transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
