"""Load a model folder's tokenizer (tokenizer.json + tokenizer_config.json) through paddleformers."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=4)
def load_tokenizer(model_dir: str):
    """The paddleformers AutoTokenizer of `model_dir`, offline; cached per folder."""
    from paddleformers.transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def encode_prompt(tokenizer, text: str, chat: bool = False) -> list[int]:
    """Token ids of `text`; chat=True wraps it as one user turn with the model's chat template
    and the assistant generation prompt. Special tokens are added as the tokenizer config says."""
    if chat:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        if hasattr(ids, "keys"):  # BatchEncoding
            ids = ids["input_ids"]
    else:
        ids = tokenizer.encode(text)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
    return [int(x) for x in ids]
