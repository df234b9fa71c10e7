"""ModelConfig.from_dir across config.json layouts and families, the model registry's refusals, and
the rotary helpers (interleaved pairing via permutation, rope types). HF parity of whole models is
in tests/model/test_model_families.py."""

from __future__ import annotations

import json

import numpy as np
import paddle
import pytest

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models import build_model
from paddle_llm_ops import RotaryTable, apply_rotary, interleaved_to_half_order

BASE = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


def read(tmp_path, **fields) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **fields}))
    return ModelConfig.from_dir(tmp_path)


def test_llama_defaults_unchanged(tmp_path):
    c = read(tmp_path, model_type="llama")
    assert (c.head_dim, c.tie_word_embeddings, c.rope_theta, c.rms_norm_eps) == (16, False, 10000.0, 1e-6)
    assert c.rope_scaling is None and not (c.attention_bias or c.mlp_bias or c.use_bias)


def test_family_defaults_follow_hf(tmp_path):
    """Fields a config.json omits take the family's HF default, not Llama's."""
    e = read(tmp_path, model_type="ernie4_5")
    assert (e.head_dim, e.tie_word_embeddings, e.rope_theta, e.rms_norm_eps) == (128, True, 500000.0, 1e-5)
    assert read(tmp_path, model_type="qwen3").head_dim == 128
    assert read(tmp_path, model_type="qwen2").head_dim == 16  # Qwen2 has no head_dim: hidden / heads
    assert read(tmp_path, model_type="qwen3", head_dim=32).head_dim == 32


def test_bias_and_window_flags(tmp_path):
    c = read(tmp_path, model_type="ernie4_5", use_bias=True)
    assert c.use_bias and not c.attention_bias
    c = read(tmp_path, model_type="llama", attention_bias=True, mlp_bias=True)
    assert c.attention_bias and c.mlp_bias
    assert read(tmp_path, model_type="qwen2", use_sliding_window=True).use_sliding_window


def test_rope_transformers4_layout(tmp_path):
    c = read(tmp_path, rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 4.0})
    assert c.rope_theta == 1e6
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    assert read(tmp_path, rope_scaling={"rope_type": "default"}).rope_scaling is None


def test_rope_transformers5_layout(tmp_path):
    """transformers 5 writes rope_parameters (theta inside); the theta there wins."""
    c = read(tmp_path, rope_theta=1.0, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    assert (c.rope_theta, c.rope_scaling) == (5e5, None)
    c = read(tmp_path, rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64})
    assert c.rope_theta == 5e5 and c.rope_scaling["rope_type"] == "llama3" and "rope_theta" not in c.rope_scaling


@pytest.mark.parametrize("fields, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "'longrope'"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({"model_type": "qwen3", "use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
])
def test_unsupported_options_raise_valueerror(tmp_path, fields, message):
    cfg = read(tmp_path, **{"model_type": "llama", **fields})
    with pytest.raises(ValueError, match=message):
        build_model(cfg)


def test_registry_builds_each_family(tmp_path):
    names = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
             "ernie4_5": "Ernie4_5ForCausalLM"}
    for model_type, cls in names.items():
        m = build_model(read(tmp_path, model_type=model_type))
        assert type(m).__name__ == cls
    assert build_model(read(tmp_path, model_type="qwen2")).arch.qkv_bias
    assert build_model(read(tmp_path, model_type="qwen3")).arch.qk_norm
    assert build_model(read(tmp_path, model_type="ernie4_5")).arch.rope_interleaved


def test_interleaved_rotary_by_permutation():
    """rotate-half rotary of x[..., p] equals interleaved (GPT-J / ERNIE) rotary of x, permuted by p."""
    d, t, heads = 16, 7, 3
    rng = np.random.default_rng(0)
    x = rng.standard_normal((t, heads, d)).astype(np.float32)
    pos = np.array([0, 1, 2, 5, 17, 40, 99])
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    ang = pos[:, None, None] * inv  # [t, 1, d/2]
    ref = np.empty_like(x)  # pairs (2i, 2i+1) rotated by angle i
    ref[..., 0::2] = x[..., 0::2] * np.cos(ang) - x[..., 1::2] * np.sin(ang)
    ref[..., 1::2] = x[..., 1::2] * np.cos(ang) + x[..., 0::2] * np.sin(ang)
    p = interleaved_to_half_order(d)
    cos, sin = RotaryTable(d, 128, 10000.0).lookup(paddle.to_tensor(pos))
    got = apply_rotary(paddle.to_tensor(np.ascontiguousarray(x[..., p])), cos, sin).numpy()
    np.testing.assert_allclose(got, ref[..., p], atol=1e-5)
    # and scores are unchanged by the permutation
    np.testing.assert_allclose(got @ got.transpose(0, 2, 1), ref @ ref.transpose(0, 2, 1), atol=1e-4)


def test_yarn_scales_cos_sin():
    plain = RotaryTable(16, 8, 1e6)
    yarn = RotaryTable(16, 8, 1e6, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    factor = 0.1 * np.log(4.0) + 1.0
    np.testing.assert_allclose(yarn.cos.numpy()[0], factor * plain.cos.numpy()[0], rtol=1e-6)
    assert not np.allclose(yarn.cos.numpy()[5] / factor, plain.cos.numpy()[5])  # frequencies changed too
