"""Make the HF transformers fixtures tests/model/test_model_families.py compares the engine against.

Run with the reference venv (torch CPU + transformers, NOT the Paddle venv):

    <ref-venv>/bin/python tests/reference/make_tiny_references.py [--family NAME ...] [--out-dir DIR]

For every family of tiny_checkpoints.FAMILIES (tests/support/tiny_checkpoints.py) it writes the tiny
random checkpoint into a temporary folder, loads it with AutoModelForCausalLM (fp32, eager attention;
any missing or unexpected weight is an error, so HF never runs on randomly initialized tensors), and
decodes 16 greedy tokens for each of the 4 prompts (token ids, lengths 3 / 12 / 37 / 70) with
generate(), one prompt at a time, KV cache on, EOS disabled.

Writes into tests/reference/fixtures/:
  tiny_<family>.npz   (compressed, ~130 KB)
    prompt_ids    [4, 70] int32, padded with -1 (row i has prompt_lens[i] real ids)
    prompt_lens   [4] int32
    output_ids    [4, 16] int32        greedy tokens
    logits        [4, 16, 512] float32 the full raw logits row behind every output token
  tiny_<family>.json  config.json as written, tensors_sha256 (see tiny_checkpoints.tensors_sha256)
                      and the model.safetensors file sha256, versions, smallest top-1/top-2 gap;
                      MoE families also the smallest routing margin (k-th vs (k+1)-th expert score)
                      and how many router calls left experts idle (see RoutingStats).

Deterministic: numpy-seeded weights, fixed thread count, greedy decoding.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "support"))  # run in another venv, not by pytest: tiny_checkpoints

import tiny_checkpoints as tc  # noqa: E402


@torch.no_grad()
def greedy(model, ids: list[int], n_new: int) -> tuple[list[int], np.ndarray]:
    """HF generate(), greedy, exactly n_new tokens; returns (tokens, raw fp32 logits [n_new, V])."""
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=n_new, do_sample=False, eos_token_id=None, pad_token_id=None,
                          output_logits=True, return_dict_in_generate=True)
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
    tokens = out.sequences[0, len(ids):].tolist()
    rows = np.stack([r[0].float().numpy() for r in out.logits])
    assert len(tokens) == len(rows) == n_new, "generate() stopped early"
    return tokens, rows


class RoutingStats:
    """Forward hooks on HF's MoE routers (mixture-of-experts families; nothing for dense ones):
    the smallest routing margin of any token, i.e. the gap between the k-th and (k+1)-th expert's
    selection score (ERNIE: softmax + e_score_correction_bias; Qwen: softmax) relative to the sum of
    those two experts' probabilities (the scale rounding noise in the scores has: for softmax
    selection about half the router-logit gap), and how many router calls (one per MoE layer per
    forward) left some experts without a token."""

    def __init__(self, model):
        self.margins, self.hit, self.calls = [], [], 0
        self.handles = [m.register_forward_hook(self._hook) for m in model.modules()
                        if type(m).__name__.endswith("TopKRouter")]

    def _hook(self, module, args, out):
        logits, _, idx = out
        probs = torch.softmax(logits.float(), dim=-1)
        scores = probs
        if hasattr(module, "moe_statics"):
            scores = probs + module.moe_statics.e_score_correction_bias.float().squeeze()
        top, pos = torch.topk(scores, idx.shape[-1] + 1, dim=-1)
        pair = torch.gather(probs, -1, pos[:, -2:]).sum(-1)
        self.margins.append(float(((top[:, -2] - top[:, -1]) / pair).min()))
        self.hit.append(int(torch.unique(idx).numel()))
        self.num_experts = scores.shape[-1]

    def remove(self):
        for h in self.handles:
            h.remove()

    def summary(self) -> dict:
        if not self.handles:
            return {}
        return {"moe_min_routing_margin": min(self.margins), "moe_router_calls": len(self.hit),
                "moe_router_calls_with_idle_experts": sum(h < self.num_experts for h in self.hit),
                "moe_min_experts_hit_in_a_call": min(self.hit)}


def make_fixture(family: str, out_dir: Path) -> dict:
    import json

    import transformers
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tc.make_checkpoint(family, tmp)
        model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                           attn_implementation="eager", output_loading_info=True)
        allowed = tc.HF_INITIALIZED.get(family, ())
        info["missing_keys"] = [k for k in info.get("missing_keys", ()) if not k.endswith(allowed or ("\0",))]
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        assert not bad, f"{family}: HF did not load the checkpoint exactly: {bad}"
        routing = RoutingStats(model)
        cfg = tc.config_json(family)
        assert type(model).__name__ == cfg["architectures"][0], type(model).__name__
        emb = model.get_input_embeddings().weight
        assert (model.lm_head.weight.data_ptr() == emb.data_ptr()) == cfg["tie_word_embeddings"], "tying differs"
        model.eval()
        model.generation_config.eos_token_id = None
        model.config.eos_token_id = None
        tensors_sha = tc.tensors_sha256(model_dir)
        file_sha = tc.file_sha256(model_dir / "model.safetensors")

        prompts = tc.prompts()
        n_new = tc.NUM_NEW_TOKENS
        out_ids = np.zeros((len(prompts), n_new), np.int32)
        logits = np.zeros((len(prompts), n_new, tc.VOCAB), np.float32)
        for i, ids in enumerate(prompts):
            out_ids[i], logits[i] = greedy(model, ids, n_new)
        routing.remove()
        del model

    top2 = np.sort(logits, axis=-1)[..., -2:]
    min_gap = float((top2[..., 1] - top2[..., 0]).min())
    pid = np.full((len(prompts), max(tc.PROMPT_LENGTHS)), -1, np.int32)
    for i, ids in enumerate(prompts):
        pid[i, :len(ids)] = ids
    npz = out_dir / f"tiny_{family}.npz"
    np.savez_compressed(npz, prompt_ids=pid, prompt_lens=np.asarray(tc.PROMPT_LENGTHS, np.int32),
                        output_ids=out_ids, logits=logits)
    meta = {
        "description": f"HF transformers greedy reference for the tiny random {family} checkpoint of "
                       "tests/support/tiny_checkpoints.py; made by tests/reference/make_tiny_references.py",
        "family": family,
        "config": cfg,
        "tensors_sha256": tensors_sha,
        "model_safetensors_sha256": file_sha,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "numpy_version": np.__version__,
        "method": "generate(), greedy, all-ones attention mask, EOS disabled, raw logits (output_logits), "
                  "fp32, eager attention, one prompt at a time",
        "max_new_tokens": n_new,
        "min_top1_top2_gap": min_gap,
        "logits_abs_max": float(np.abs(logits).max()),
        **routing.summary(),
    }
    (out_dir / f"tiny_{family}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{family}: wrote {npz.name} ({npz.stat().st_size / 1024:.0f} KiB); min top-1/top-2 gap {min_gap:.3f}; "
          f"first tokens {out_ids[:, :6].tolist()}", flush=True)
    return meta


def main() -> int:
    return run_families(make_fixture, __doc__)


def run_families(make_fixture_fn, doc: str) -> int:
    """The command line both fixture scripts share: parse --family / --out-dir / --threads, make torch
    deterministic, call make_fixture_fn(family, out_dir) for each family."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--family", action="append", choices=sorted(tc.FAMILIES),
                    help="only these families (repeatable); default all")
    ap.add_argument("--out-dir", default=str(HERE / "fixtures"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for family in args.family or list(tc.FAMILIES):
        make_fixture_fn(family, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
