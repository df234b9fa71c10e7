"""Load a model folder's tokenizer (tokenizer.json + tokenizer_config.json) through paddleformers."""

from __future__ import annotations

import functools

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError


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


@functools.lru_cache(maxsize=8)
def max_token_bytes(tokenizer) -> int:
    """Most bytes of text one token of `tokenizer` can stand for: the longest UTF-8 form of a
    vocabulary entry (added and special tokens included), at least 1. An upper bound for byte-level
    BPE (each character of an entry stands for one byte) and SentencePiece (U+2581 stands for one
    space; a byte-fallback entry `<0x41>` for one byte). Cached per tokenizer (one vocabulary scan)."""
    return max((len(t.encode("utf-8")) for t in tokenizer.get_vocab()), default=1) or 1


def check_prompt_bytes(tokenizer, text: str, max_tokens: int, field: str = "prompt",
                       limit_name: str = "max_model_len") -> None:
    """Refuse, before tokenizing it, a prompt so long that it must exceed `max_tokens` tokens: more
    than max_tokens x max_token_bytes(tokenizer) bytes. Tokenizing is linear in the text (50 MB took
    85 s on 2 cores) and nothing of such a prompt could be served. A tokenizer whose normalizer drops
    text (e.g. collapses whitespace) could fit a longer text: it is refused as well, by this rule.
    field: the prompt's name in the caller's terms; limit_name: what max_tokens is, for the message.
    Raises InvalidRequestError(field, ..., PROMPT_TOO_LONG)."""
    per_token = max_token_bytes(tokenizer)
    limit = max_tokens * per_token
    if len(text) > limit:  # characters <= bytes: the common case never encodes the text
        n = len(text.encode("utf-8"))
        raise InvalidRequestError(field, f"too long: {n} bytes cannot fit in {limit_name} {max_tokens} tokens "
                                         f"(a token of this model stands for at most {per_token} bytes, so at "
                                         f"most {limit} bytes can)", ErrorCode.PROMPT_TOO_LONG)
