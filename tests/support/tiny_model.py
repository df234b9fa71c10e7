"""A tiny random-weight Llama checkpoint in HF layout, for tests that need a model but not SmolLM2.

make_tiny_llama(out_dir, tokenizer_dir) writes config.json (model_type llama, hidden 64, 2 layers,
4 heads / 2 KV heads, head_dim 16), generation_config.json, model.safetensors (fp32, numpy) and the
tokenizer files copied from `tokenizer_dir` (the vocab size is taken from its tokenizer.json, so the
SmolLM2 tokenizer gives vocab 49152: about 25 MB of weights, built in well under a second).

The random init is scaled up on purpose: with HF's std 0.02 every logit is near zero and greedy
choices nearly tie, so tiny float differences between batched and unbatched runs would flip tokens.
Here the logits have std ~8 (top-1 / top-2 gaps of order 1) and attention scores are sharp enough
that a wrong position or a wrong KV slot changes the output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 128
EOS_ID = 2


def _vocab_size(tokenizer_dir: Path) -> int:
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    return max(ids) + 1


def make_tiny_llama(out_dir: str | Path, tokenizer_dir: str | Path, seed: int = 0, tie_word_embeddings: bool = False,
                    max_position_embeddings: int = 1024) -> Path:
    """Write the checkpoint into out_dir (created) and return it."""
    from safetensors.numpy import save_file

    out, tok_dir = Path(out_dir), Path(tokenizer_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, out / name)
    vocab = _vocab_size(tok_dir)
    rng = np.random.default_rng(seed)

    def lin(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:  # HF Linear layout [out, in]
        return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((vocab, HIDDEN)).astype(np.float32),
         "model.norm.weight": norm(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = norm(HIDDEN)
        w[p + "self_attn.q_proj.weight"] = lin(HEADS * HEAD_DIM, HIDDEN, 2.0)
        w[p + "self_attn.k_proj.weight"] = lin(KV_HEADS * HEAD_DIM, HIDDEN, 2.0)
        w[p + "self_attn.v_proj.weight"] = lin(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = lin(HIDDEN, HEADS * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = lin(INTERMEDIATE, HIDDEN)
        w[p + "mlp.up_proj.weight"] = lin(INTERMEDIATE, HIDDEN)
        w[p + "mlp.down_proj.weight"] = lin(HIDDEN, INTERMEDIATE)
    if not tie_word_embeddings:
        w["lm_head.weight"] = lin(vocab, HIDDEN, 8.0)
    save_file(w, str(out / "model.safetensors"))

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": max_position_embeddings, "vocab_size": vocab,
        "tie_word_embeddings": tie_word_embeddings, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "bos_token_id": 1, "eos_token_id": EOS_ID, "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": EOS_ID}) + "\n")
    return out
