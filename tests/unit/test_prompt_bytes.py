"""The byte bound on prompts (paddle_llm_engine/tokenizer.py check_prompt_bytes): a text that cannot
fit in max_tokens tokens is refused untokenized, naming the field; the bound is sound, i.e. no text
of more than max_tokens x max_token_bytes bytes tokenizes to max_tokens tokens or fewer, checked on
the default model's real tokenizer with the texts that pack the most bytes into a token."""

from __future__ import annotations

import pytest

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_engine.tokenizer import check_prompt_bytes, encode_prompt, load_tokenizer, max_token_bytes


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return load_tokenizer(str(smollm2_dir))


def test_max_token_bytes_covers_every_entry(tok):
    per = max_token_bytes(tok)
    for entry_id in range(len(tok.get_vocab())):
        text = tok.decode([entry_id])
        assert len(text.encode("utf-8")) <= per


@pytest.mark.parametrize("unit", [" " * 64, "\n" + " " * 80, "hello ", "\u4f60\u597d", "\U0001F600", "ab" * 50])
def test_the_bound_is_sound_for_texts_that_pack_many_bytes_per_token(tok, unit):
    """Whatever the text, tokens >= bytes / max_token_bytes: so refusing above the bound never refuses a
    prompt that would have fit."""
    per = max_token_bytes(tok)
    text = unit * 200
    n_tokens = len(encode_prompt(tok, text))
    assert n_tokens * per >= len(text.encode("utf-8")), (n_tokens, per)


def test_a_prompt_over_the_bound_is_refused_naming_the_field(tok):
    per = max_token_bytes(tok)
    with pytest.raises(InvalidRequestError) as e:
        check_prompt_bytes(tok, "x" * (100 * per + 1), 100, field="text_input")
    assert e.value.field == "text_input"
    assert f"too long: {100 * per + 1} bytes cannot fit in max_model_len 100 tokens" in str(e.value)
    check_prompt_bytes(tok, "x" * (100 * per), 100)  # at the bound: tokenized, the token count decides
