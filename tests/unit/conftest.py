"""Unit-test fixtures: import path for the in-tree packages, the SmolLM2 tokenizer folder, and a
tiny random-weight Llama checkpoint (see tiny_model.py) shared by the tests of one session."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
if importlib.util.find_spec("paddle_llm_engine") is None:  # not pip-installed: use the source tree
    sys.path[:0] = [str(REPO / "backend"), str(REPO / "ops")]
if str(HERE) not in sys.path:  # for `import tiny_model` under any pytest import mode
    sys.path.insert(0, str(HERE))

from tiny_model import make_tiny_llama  # noqa: E402


def smollm2_dir() -> Path:
    """The converted SmolLM2 folder (its tokenizer is used here); fails clearly when missing."""
    d = Path(os.environ.get("PADDLE_LLM_MODEL_DIR", REPO / "build" / "SmolLM2-135M-Instruct"))
    if not (d / "tokenizer.json").is_file():
        pytest.fail(f"model folder {d} has no tokenizer.json: run the project setup (scripts/prepare_model.py) "
                    f"or point PADDLE_LLM_MODEL_DIR at a converted SmolLM2-135M-Instruct folder", pytrace=False)
    return d


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from paddle_llm_engine.tokenizer import load_tokenizer

    return load_tokenizer(str(smollm2_dir()))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A 2-layer random Llama with the SmolLM2 tokenizer (vocab 49152), made once per session."""
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), smollm2_dir()))
