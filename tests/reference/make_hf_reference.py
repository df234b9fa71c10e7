"""Make the HF transformers reference fixture the SmolLM2 model tests compare the engine against.

Run with the reference venv (torch CPU + transformers, NOT the Paddle venv):

    <ref-venv>/bin/python tests/reference/make_hf_reference.py [--model-dir DIR] [--out-dir DIR]

It loads the converted SmolLM2-135M-Instruct folder (env PADDLE_LLM_MODEL_DIR, default
<repo>/build/SmolLM2-135M-Instruct) with AutoModelForCausalLM in fp32 (eager attention), tokenizes
8 prompts of clearly different lengths (plain text and chat-templated; one with CJK, one with
emoji) with the folder's own tokenizer, and decodes 24 tokens per prompt with generate() (greedy,
KV cache, all-ones attention mask), one prompt at a time, without stopping at EOS.

Writes into tests/reference/fixtures/:
  smollm2_greedy.npz   (compressed)
    prompt_ids        [P, Lmax] int32, padded with -1 (row i has prompt_lens[i] real ids)
    prompt_lens       [P] int32
    output_ids        [P, N] int32      greedy tokens (N = 24)
    top_ids           [P, N, K] int32   top-K (K = 20) ids of the logits that chose output k
    top_vals          [P, N, K] float32 their logits
    logsumexp         [P, N] float32    logsumexp of each of those logits rows
    full_positions    [F] int32         output indices whose full logits rows are stored
    full_logits       [P, F, V] float32 full rows (F = 3: the prefill row and two decode rows)
  smollm2_greedy.json  metadata: versions, model sha256, prompts (text / kind), lengths, EOS
                       positions, full_positions.

Storage: a full fp32 row is 49152 * 4 bytes = 192 KiB and barely compresses, so full rows are
kept for 3 positions per prompt (about 4 MiB for 8 prompts); every position has top-20 + logsumexp.

The test feeds exactly prompt_ids, so tokenizer differences between the venvs cannot matter.
Deterministic: fixed seed, fixed thread count, greedy decoding, no sampling.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
N_NEW = 24
TOP_K = 20
FULL_POSITIONS = [0, 8, 23]  # output index 0 = logits at the last prompt position (prefill)

_LONG_PLAIN = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a "
    "goldsmith from Mainz, combined several existing technologies into a practical system for mass "
    "producing books. Movable type had been invented earlier in East Asia, where printers in China "
    "and Korea used ceramic, wooden and later metal characters, but the large number of characters in "
    "those writing systems limited its spread. Gutenberg's contribution was a hand mould that cast "
    "uniform metal type quickly, an oil-based ink that adhered to metal, and a screw press adapted "
    "from the presses used to make wine and olive oil. His Bible, completed around 1455, showed that "
    "printed books could match the beauty of manuscripts. Within fifty years, presses operated in more "
    "than two hundred European cities and had produced millions of volumes. The consequences were "
    "profound: prices fell, literacy rose, scholars could compare identical copies of texts, and ideas "
    "travelled faster than any authority could control. The Reformation, the Scientific Revolution and "
    "the rise of newspapers all depended on cheap printing. Historians still debate how quickly these "
    "changes happened and how much credit one inventor deserves, but few doubt that the press changed "
    "the way knowledge was stored and shared. Printers also standardised spelling and grammar, because "
    "a single edition reached readers in many regions, and national languages slowly replaced Latin "
    "in science and government. Maps, musical scores and technical drawings could now be copied "
    "without the errors that crept into every hand-made copy. In the centuries that followed,"
)

_MEDIUM_PLAIN = (
    "Photosynthesis is the process by which green plants, algae and some bacteria convert light energy "
    "into chemical energy. In the chloroplasts, chlorophyll absorbs mostly red and blue light, and the "
    "energy drives the splitting of water molecules, releasing oxygen as a by-product. The captured "
    "energy is stored in ATP and NADPH, which the Calvin cycle then uses to fix carbon dioxide into"
)

_CHAT_SUMMARY = (
    "Summarize the following text in two sentences.\n\n"
    "Rivers have shaped human settlement for thousands of years. Early farming communities grew up "
    "along the Nile, the Tigris and Euphrates, the Indus and the Yellow River, where seasonal floods "
    "left fertile silt on the fields. Rivers also provided drinking water, fish, and a highway for "
    "trade long before roads were built. Cities such as Cairo, Baghdad, London and Paris still sit on "
    "the rivers that made their growth possible. Today, dams generate electricity and store water for "
    "irrigation, but they also block fish migration and trap sediment that deltas need. Engineers and "
    "ecologists now look for ways to balance these uses, for example by building fish ladders, "
    "releasing controlled floods, and removing old dams that no longer serve a purpose."
)

# (kind, content). kind "plain": the text as is; kind "chat": one user message, chat template with
# the generation prompt appended.
PROMPTS = [
    ("plain", "The capital of France is"),
    ("chat", "What is 2+2?"),
    ("plain", "北京是中国的首都，也是一座历史悠久的城市。它的著名景点包括"),
    ("chat", "Write a short poem about the sea 🌊🐚 and the sun ☀️!"),
    ("plain", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("plain", _MEDIUM_PLAIN),
    ("chat", _CHAT_SUMMARY),
    ("plain", _LONG_PLAIN),
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def encode(tok, kind: str, content: str) -> list[int]:
    if kind == "chat":
        text = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                       tokenize=False)
    else:
        text = content
    return list(tok(text, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def greedy(model, ids: list[int], n_new: int) -> tuple[list[int], list[np.ndarray]]:
    """HF generate(), greedy, exactly n_new tokens; returns (tokens, raw fp32 logits rows).

    EOS is disabled on the model's generation config (the caller records where it came instead);
    the attention mask is all ones: pad id 2 is <|im_end|>, which is a real token in chat prompts."""
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=n_new, do_sample=False, eos_token_id=None, pad_token_id=None,
                          output_logits=True, return_dict_in_generate=True)
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
    tokens = out.sequences[0, len(ids):].tolist()
    rows = [r[0].float().numpy().copy() for r in out.logits]
    assert len(tokens) == len(rows) == n_new, "generate() stopped early"
    return tokens, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=os.environ.get("PADDLE_LLM_MODEL_DIR",
                                                          str(REPO / "build" / "SmolLM2-135M-Instruct")))
    ap.add_argument("--out-dir", default=str(REPO / "tests" / "reference" / "fixtures"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(args.model_dir)
    if not (model_dir / "model.safetensors").is_file():
        print(f"error: {model_dir}/model.safetensors not found (run scripts/prepare_model.py first)",
              file=sys.stderr)
        return 1
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    eos_ids = model.generation_config.eos_token_id
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids or [])
    # Generate past EOS (the engine tests use ignore_eos): with EOS set on the model's configs,
    # generate() stops there even when the call's own GenerationConfig says eos_token_id=None.
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None

    prompt_ids = [encode(tok, kind, content) for kind, content in PROMPTS]
    lens = [len(p) for p in prompt_ids]
    P, V = len(PROMPTS), model.config.vocab_size
    out_ids = np.zeros((P, N_NEW), np.int32)
    top_ids = np.zeros((P, N_NEW, TOP_K), np.int32)
    top_vals = np.zeros((P, N_NEW, TOP_K), np.float32)
    lse = np.zeros((P, N_NEW), np.float32)
    full = np.zeros((P, len(FULL_POSITIONS), V), np.float32)
    eos_positions = []
    for i, ids in enumerate(prompt_ids):
        tokens, rows = greedy(model, ids, N_NEW)
        out_ids[i] = tokens
        for k, r in enumerate(rows):
            order = np.argsort(-r, kind="stable")[:TOP_K]
            top_ids[i, k] = order
            top_vals[i, k] = r[order]
            m = r.astype(np.float64).max()
            lse[i, k] = m + np.log(np.exp(r.astype(np.float64) - m).sum())
        for j, k in enumerate(FULL_POSITIONS):
            full[i, j] = rows[k]
        eos_positions.append([k for k, t in enumerate(tokens) if t in eos_ids])
        print(f"prompt {i} ({PROMPTS[i][0]}, {lens[i]} tokens): {tok.decode(tokens)!r}", flush=True)

    pid = np.full((P, max(lens)), -1, np.int32)
    for i, ids in enumerate(prompt_ids):
        pid[i, :len(ids)] = ids

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out_dir / "smollm2_greedy.npz", prompt_ids=pid, prompt_lens=np.asarray(lens, np.int32),
                        output_ids=out_ids, top_ids=top_ids, top_vals=top_vals, logsumexp=lse,
                        full_positions=np.asarray(FULL_POSITIONS, np.int32), full_logits=full)
    meta = {
        "description": "HF transformers greedy reference for SmolLM2-135M-Instruct (fp32, CPU); "
                       "made by tests/reference/make_hf_reference.py",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "numpy_version": np.__version__,
        "method": "generate(), greedy, all-ones attention mask, EOS disabled, raw logits (output_logits)",
        "attn_implementation": "eager",
        "threads": args.threads,
        "model_safetensors_sha256": sha256(model_dir / "model.safetensors"),
        "max_new_tokens": N_NEW,
        "top_k_stored": TOP_K,
        "full_positions": FULL_POSITIONS,
        "eos_token_ids": eos_ids,
        "prompts": [{"kind": kind, "text": content, "num_tokens": n, "eos_positions": e,
                     "output_text": tok.decode(out_ids[i].tolist())}
                    for i, ((kind, content), n, e) in enumerate(zip(PROMPTS, lens, eos_positions))],
    }
    (out_dir / "smollm2_greedy.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    size = (out_dir / "smollm2_greedy.npz").stat().st_size
    print(f"wrote {out_dir / 'smollm2_greedy.npz'} ({size / 2**20:.2f} MiB) and smollm2_greedy.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
