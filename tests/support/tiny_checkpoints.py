"""Tiny random-weight checkpoints of every supported model family, made deterministically with numpy.

Shared by tests/reference/make_tiny_references.py (which runs them through HF transformers to make
the fixtures) and tests/model/test_model_families.py (which regenerates them and runs the engine),
so both sides see the same weights without committing any. Pure numpy + json + safetensors.numpy.

Each checkpoint: 2 layers, hidden 64, 4 heads / 2 KV heads, intermediate 128, vocab 512, fp32
model.safetensors in HF layout, config.json as the family's real configs write it, a
generation_config.json, and a 512-entry word-level tokenizer (tokens "t3".."t511" plus <unk>, <s>,
</s>) because the engine loads a tokenizer from the model folder; the tests feed token ids directly.

FAMILIES (name -> what it covers):
  llama_tied    Llama, tied embeddings, plain rotary (SmolLM2-like)
  llama_untied  Llama, untied lm_head, llama3 rope_scaling, attention_bias + mlp_bias (q/k/v/o and MLP biases)
  qwen2         Qwen2, q/k/v biases, tied, no head_dim in config.json (Qwen2.5-0.5B-like)
  qwen2_yarn    Qwen2, untied, yarn rope_scaling in the old {"type": ...} spelling
  qwen3         Qwen3, q_norm/k_norm, explicit head_dim 32 != hidden/heads, tied (Qwen3-0.6B-like)
  ernie4_5      ERNIE 4.5 dense, interleaved rotary, explicit head_dim 32, use_bias false, tied (0.3B-like)
Mixture-of-experts families (8 routed experts, expert intermediate 32, 4-5 layers with dense and MoE
layers mixed; prompts of 3 tokens and decode steps route to fewer than 8 experts, so some experts
receive no token in those steps):
  qwen3_moe     Qwen3-MoE, top-2, norm_topk_prob, mlp_only_layers [0, 2] (MoE layers 1, 3), q/k norm,
                explicit head_dim 32, untied (Qwen3-30B-A3B-like)
  qwen2_moe     Qwen2-MoE, top-2, unnormalized top-k, decoder_sparse_step 2 (MoE layers 1, 3), shared
                expert (intermediate 96) with its sigmoid gate, q/k/v biases, untied (Qwen1.5-MoE-like)
  ernie4_5_moe  ERNIE 4.5 MoE, moe_k 2, moe_layer_start_index 1 / moe_layer_end_index 3 of 5 layers
                (MoE layers 1-3), 2 shared experts, routing bias e_score_correction_bias, no head_dim
                in config.json (HF: hidden / heads = 16), tied (ERNIE-4.5-21B-A3B-like)
  ernie4_5_moe_interval  ERNIE 4.5 MoE, moe_k 3, moe_layer_start_index 0 / moe_layer_interval 2 (MoE
                layers 1, 3), no shared experts, no routing bias in the checkpoint (HF: zeros)

The init is scaled up on purpose (as tests/support/tiny_model.py explains): logits of std ~8 keep
greedy choices far from ties, and sharp attention makes a wrong position, rotary pairing or KV slot
change the output. The o_proj and down_proj outputs are scaled up (gain 3) so that the blocks, not
the token's own embedding, dominate the residual stream: with tied embeddings a weak stack just
repeats the last prompt token. Routers are scaled up too (gain 4: router logits of std ~4) so that
the k-th and (k+1)-th experts of a token are far apart and rounding never changes which experts a
token goes to; ERNIE's routing bias (std 0.1, probabilities being O(0.1)) changes some choices.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

VOCAB = 512
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 128
MAX_POSITIONS = 256
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
EOS_ID = 2
PROMPT_LENGTHS = (3, 12, 37, 70)
NUM_NEW_TOKENS = 16
MOE_EXPERTS = 8
MOE_INTERMEDIATE = 32
PROMPT_SEED = 20240611

_COMMON = {
    "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "max_position_embeddings": MAX_POSITIONS,
    "vocab_size": VOCAB, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": EOS_ID, "torch_dtype": "float32",
}

# name -> (seed, config.json fields beyond _COMMON, tensors: which optional ones the family has)
FAMILIES: dict[str, tuple[int, dict, dict]] = {
    "llama_tied": (11, {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": HIDDEN // HEADS,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": True,
        "attention_bias": False, "mlp_bias": False,
    }, {}),
    "llama_untied": (12, {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": HIDDEN // HEADS,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64},
        "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True,
    }, {"qkv_bias": True, "o_bias": True, "mlp_bias": True}),
    "qwen2": (13, {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": True, "use_sliding_window": False,
        "sliding_window": MAX_POSITIONS, "max_window_layers": LAYERS,
    }, {"qkv_bias": True}),
    "qwen2_yarn": (14, {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": MAX_POSITIONS,
        "max_window_layers": LAYERS,
    }, {"qkv_bias": True}),
    "qwen3": (15, {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": LAYERS,
    }, {"qk_norm": True}),
    "ernie4_5": (16, {
        "architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5", "head_dim": 32, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": True, "use_bias": False, "pad_token_id": 0,
    }, {}),
    # Mixture of experts. opt["moe"]: which layers are sparse (as HF's rule for the config decides:
    # a checkpoint that disagrees fails to load in HF) and the expert tensors' naming.
    "qwen3_moe": (17, {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 4, "head_dim": 32,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": False,
        "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 4,
        "num_experts": MOE_EXPERTS, "num_experts_per_tok": 2, "moe_intermediate_size": MOE_INTERMEDIATE,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [0, 2],
    }, {"qk_norm": True, "moe": {"layers": (1, 3), "style": "qwen"}}),
    "qwen2_moe": (18, {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_hidden_layers": 4,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": False,
        "use_sliding_window": False, "sliding_window": MAX_POSITIONS, "max_window_layers": 4,
        "num_experts": MOE_EXPERTS, "num_experts_per_tok": 2, "moe_intermediate_size": MOE_INTERMEDIATE,
        "shared_expert_intermediate_size": 96, "norm_topk_prob": False, "decoder_sparse_step": 2,
        "mlp_only_layers": [],
    }, {"qkv_bias": True, "moe": {"layers": (1, 3), "style": "qwen", "shared": 96, "shared_gate": True}}),
    "ernie4_5_moe": (19, {
        "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "num_hidden_layers": 5,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "use_bias": False,
        "pad_token_id": 0, "moe_num_experts": MOE_EXPERTS, "moe_k": 2, "moe_intermediate_size": MOE_INTERMEDIATE,
        "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 3, "moe_layer_interval": 1,
    }, {"moe": {"layers": (1, 2, 3), "style": "ernie", "shared": 2 * MOE_INTERMEDIATE, "routing_bias": True}}),
    "ernie4_5_moe_interval": (20, {
        "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "num_hidden_layers": 4,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "use_bias": False,
        "pad_token_id": 0, "moe_num_experts": MOE_EXPERTS, "moe_k": 3, "moe_intermediate_size": MOE_INTERMEDIATE,
        "moe_num_shared_experts": 0, "moe_layer_start_index": 0, "moe_layer_interval": 2,
    }, {"moe": {"layers": (1, 3), "style": "ernie"}}),
}
# Checkpoint tensors HF reports missing and initializes itself (to zeros), per family.
HF_INITIALIZED = {"ernie4_5_moe_interval": ("mlp.gate.moe_statics.e_score_correction_bias",)}


def config_json(family: str, vocab: int = VOCAB) -> dict:
    """config.json of the family; vocab: its vocab_size (other tokenizers than tokenizer_files())."""
    return {**_COMMON, **FAMILIES[family][1], "vocab_size": vocab}


def prompts() -> list[list[int]]:
    """The 4 prompts (token ids in [3, VOCAB), lengths PROMPT_LENGTHS) every family is run on."""
    rng = np.random.default_rng(PROMPT_SEED)
    return [rng.integers(len(SPECIAL_TOKENS), VOCAB, size=n).tolist() for n in PROMPT_LENGTHS]


def make_weights(family: str, vocab: int = VOCAB) -> dict[str, np.ndarray]:
    """HF-layout fp32 tensors (Linear weights [out, in]), drawn in a fixed order from the family's seed;
    vocab: rows of the embedding and LM head (VOCAB for the reference fixtures)."""
    seed, cfg, opt = FAMILIES[family]
    rng = np.random.default_rng(seed)
    d = cfg.get("head_dim") or HIDDEN // HEADS

    def lin(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)

    def vec(n: int, mean: float, std: float) -> np.ndarray:
        return (mean + std * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((vocab, HIDDEN)).astype(np.float32),
         "model.norm.weight": vec(HIDDEN, 1.0, 0.1)}
    moe = opt.get("moe")
    for i in range(cfg.get("num_hidden_layers", LAYERS)):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        w[p + "input_layernorm.weight"] = vec(HIDDEN, 1.0, 0.1)
        w[p + "post_attention_layernorm.weight"] = vec(HIDDEN, 1.0, 0.1)
        w[a + "q_proj.weight"] = lin(HEADS * d, HIDDEN, 2.0)
        w[a + "k_proj.weight"] = lin(KV_HEADS * d, HIDDEN, 2.0)
        w[a + "v_proj.weight"] = lin(KV_HEADS * d, HIDDEN)
        w[a + "o_proj.weight"] = lin(HIDDEN, HEADS * d, 3.0)
        if opt.get("qkv_bias"):
            w[a + "q_proj.bias"] = vec(HEADS * d, 0.0, 0.5)
            w[a + "k_proj.bias"] = vec(KV_HEADS * d, 0.0, 0.5)
            w[a + "v_proj.bias"] = vec(KV_HEADS * d, 0.0, 0.5)
        if opt.get("o_bias"):
            w[a + "o_proj.bias"] = vec(HIDDEN, 0.0, 0.2)
        if opt.get("qk_norm"):  # q/k are normalized per head: the weights set the score scale
            w[a + "q_norm.weight"] = vec(d, 2.0, 0.3)
            w[a + "k_norm.weight"] = vec(d, 2.0, 0.3)
        if moe and i in moe["layers"]:
            w.update(_moe_weights(m, cfg, moe, lin, vec))
            continue
        w[m + "gate_proj.weight"] = lin(INTERMEDIATE, HIDDEN)
        w[m + "up_proj.weight"] = lin(INTERMEDIATE, HIDDEN)
        w[m + "down_proj.weight"] = lin(HIDDEN, INTERMEDIATE, 3.0)
        if opt.get("mlp_bias"):
            w[m + "gate_proj.bias"] = vec(INTERMEDIATE, 0.0, 0.2)
            w[m + "up_proj.bias"] = vec(INTERMEDIATE, 0.0, 0.2)
            w[m + "down_proj.bias"] = vec(HIDDEN, 0.0, 0.2)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = lin(vocab, HIDDEN, 8.0)
    return w


def _moe_weights(m: str, cfg: dict, moe: dict, lin, vec) -> dict[str, np.ndarray]:
    """One sparse MLP in the layout of the released checkpoints (transformers 5 merges the
    per-expert tensors into 3-D ones at load): router `gate.weight` [E, H], ERNIE's routing bias
    `moe_statics.e_score_correction_bias` [1, E], experts.<e>.{gate,up,down}_proj, the shared expert
    (ERNIE `shared_experts.`, Qwen2-MoE `shared_expert.` plus `shared_expert_gate.weight` [1, H])."""
    n_exp = cfg.get("num_experts", cfg.get("moe_num_experts"))
    inter = cfg["moe_intermediate_size"]
    w = {m + "gate.weight": lin(n_exp, HIDDEN, 4.0)}
    if moe.get("routing_bias"):
        w[m + "moe_statics.e_score_correction_bias"] = vec(n_exp, 0.0, 0.1).reshape(1, n_exp)
    for e in range(n_exp):
        x = f"{m}experts.{e}."
        w[x + "gate_proj.weight"] = lin(inter, HIDDEN)
        w[x + "up_proj.weight"] = lin(inter, HIDDEN)
        w[x + "down_proj.weight"] = lin(HIDDEN, inter, 3.0)
    if moe.get("shared"):
        s = m + ("shared_experts." if moe["style"] == "ernie" else "shared_expert.")
        w[s + "gate_proj.weight"] = lin(moe["shared"], HIDDEN)
        w[s + "up_proj.weight"] = lin(moe["shared"], HIDDEN)
        w[s + "down_proj.weight"] = lin(HIDDEN, moe["shared"], 3.0)
    if moe.get("shared_gate"):
        w[m + "shared_expert_gate.weight"] = lin(1, HIDDEN, 2.0)
    return w


def tokenizer_files() -> dict[str, dict]:
    """tokenizer.json (word level: "t<id>" separated by spaces) and tokenizer_config.json."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIAL_TOKENS), VOCAB)})
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(SPECIAL_TOKENS)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
               "eos_token": "</s>", "model_max_length": MAX_POSITIONS}
    return {"tokenizer.json": tok, "tokenizer_config.json": tok_cfg}


def make_checkpoint(family: str, out_dir: str | Path) -> Path:
    """Write the family's checkpoint folder (created) and return it."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(make_weights(family), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config_json(family), indent=1) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": EOS_ID}) + "\n")
    for name, content in tokenizer_files().items():
        (out / name).write_text(json.dumps(content, indent=1) + "\n")
    return out


def tensors_sha256(model_dir: str | Path) -> str:
    """sha256 over the checkpoint's tensors (sorted names, dtype, shape, bytes): detects generator
    drift (numpy's random streams, init code) independently of the safetensors file encoding."""
    from safetensors.numpy import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(str(Path(model_dir) / "model.safetensors")).items()):
        h.update(f"{name}|{t.dtype.str}|{list(t.shape)}|".encode())
        h.update(np.ascontiguousarray(t).tobytes())
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
