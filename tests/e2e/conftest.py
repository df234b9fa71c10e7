"""End-to-end fixtures on top of the session `triton_server` (tests/conftest.py): the SmolLM2
tokenizer (to count tokens and build chat prompts the way the server does), the llm model's
max_model_len, and helpers shared by the test modules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LLM_CONFIG = REPO / "model_repository" / "llm" / "config.pbtxt"


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir):
    from paddle_llm_engine.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="session")
def chat_prompt(tokenizer):
    """text -> the chat-templated prompt string (one user turn + generation prompt), which is what
    the ensemble's apply_chat_template=True tokenizes; sent as text_input to `llm` directly."""

    def make(text: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)

    return make


@pytest.fixture(scope="session")
def count_tokens(tokenizer):
    """Token count of a raw (no chat template) prompt, as the server's encode_prompt computes it."""
    from paddle_llm_engine.tokenizer import encode_prompt

    return lambda text: len(encode_prompt(tokenizer, text))


@pytest.fixture(scope="session")
def max_model_len(smollm2_dir) -> int:
    """The llm config's max_model_len parameter; 0 means the model's max_position_embeddings."""
    m = re.search(r'key:\s*"max_model_len"\s*value:\s*\{\s*string_value:\s*"(\d*)"', LLM_CONFIG.read_text())
    v = int(m.group(1)) if m and m.group(1) else 0
    if v <= 0:
        v = json.loads((Path(smollm2_dir) / "config.json").read_text())["max_position_embeddings"]
    return v
