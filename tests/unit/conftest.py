"""Unit-test fixtures: the SmolLM2 tokenizer (folder: `smollm2_dir` of tests/conftest.py) and a tiny
random-weight Llama checkpoint (see tests/support/tiny_model.py) shared by the tests of one session."""

from __future__ import annotations

import pytest

from tiny_model import make_tiny_llama  # tests/support (pyproject's pytest pythonpath)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from paddle_llm_engine.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_dir) -> str:
    """A 2-layer random Llama with the SmolLM2 tokenizer (vocab 49152), made once per session."""
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), smollm2_dir))
