"""Offline engine benchmark: our Paddle engine (LLM offline API) against HF transformers on torch CPU,
greedy decoding at several batch sizes, with the memory-bandwidth limit as the yardstick. One command:

    .venv/bin/python benchmarks/bench_engine.py [--model-dir build/SmolLM2-135M-Instruct] [--batches 1,8,32]
        [--peer-batches 1,8] [--max-tokens 64] [--threads N] [--bandwidth-gbs 35] [--repeats 1]
        [--ref-python build/ref-venv/bin/python] [--no-peer] [--json]
        [--quantization wint8|wint4] [--quantization-group-size G]

Workload: fixed chat-formatted questions (the model's chat template, tokenized once here); batch B
takes the first B of them, all submitted at once; greedy, max_tokens tokens per request with EOS
ignored, so every request makes exactly max_tokens tokens.

Ours: `paddle_llm_engine.LLM(...).generate(token_ids, SamplingParams(temperature=0, max_tokens=M,
ignore_eos=True))`, with each engine step timed (the engine's `step` is wrapped, nothing else
changes). Prefill phase = steps until every request has its first token (one step unless the prompts
exceed max_num_batched_tokens); decode phase = every later step.
  prefill tokens/s = prompt tokens / prefill time;
  decode tokens/s  = tokens made in decode steps / decode time (the first token of each request,
                     made by the prefill step, is excluded);
  step time        = decode time / decode steps.
Bandwidth limit: a decode step reads every fp32 weight once, bytes = parameter count * 4 (counted
from the safetensors headers; a tied embedding is stored once and counts once, as the lm head), so
limit tokens/s = B * bandwidth / bytes; "of limit" = decode tokens/s / limit.

Peer: benchmarks/hf_transformers_peer.py in the reference venv (--ref-python; default
build/ref-venv/bin/python, made by `bash scripts/setup.sh --reference`; skipped with a note if missing):
same weights folder, same token ids, greedy `generate` with max_new_tokens M and no EOS stopping,
batches left-padded with an explicit attention mask, timed per step by a logits processor. Both sides
use --threads threads (paddle via EngineConfig.num_threads, torch via torch.set_num_threads, and
OMP_NUM_THREADS / MKL_NUM_THREADS for the peer process). Runs are sequential, never concurrent: the
peer runs first, before our engine is built in this process. The greedy tokens of both are compared
(in full, and up to each sequence's first EOS: past an ignored EOS near-ties are common).
--quantization / --quantization-group-size: EngineConfig's settings for ours (weight-only int8 / int4);
the bandwidth limit stays the fp32 one (the yardstick), so a quantized engine can exceed 100%.
Each measured run is preceded by a short warm-up at the same batch size; with --repeats N the run
with the shortest decode time is reported. "ours/peer" > 1 means we are faster (for times: < 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

from bench_engine_report import derive, peer_rows, print_report  # noqa: I001 (this folder, run as a script)

REPO_ROOT = Path(__file__).resolve().parent.parent
PEER_SCRIPT = Path(__file__).resolve().parent / "hf_transformers_peer.py"

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis in simple terms.",
    "Write a haiku about autumn leaves.",
    "What are three tips for staying productive when working from home?",
    "How does a binary search work?",
    "Give me a short recipe for pancakes.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is the difference between a virus and a bacterium?",
    "Write a Python function that reverses a string.",
    "What should I pack for a weekend hiking trip?",
    "Translate 'Good morning, how are you?' into Spanish.",
    "What causes the seasons on Earth?",
    "Suggest a name for a friendly robot and explain why.",
    "How do vaccines help the immune system?",
    "List four planets of the solar system and one fact about each.",
    "What is the Pythagorean theorem?",
    "Describe a sunset over the ocean.",
    "How do I make a good cup of tea?",
    "What is machine learning?",
    "Give two arguments for learning a second language.",
    "Why do cats purr?",
    "Explain what a database index is.",
    "Write a limerick about a programmer.",
    "How far is the Moon from the Earth?",
    "What are the primary colors?",
    "Explain recursion to a ten-year-old.",
    "What is the boiling point of water at sea level?",
    "Name three famous painters and one work by each.",
    "How does a refrigerator keep food cold?",
    "What is the difference between weather and climate?",
    "Give me a motivational quote and explain it.",
]


# --------------------------------------------------------------------------- helpers


def tensor_shapes(model_dir: Path, tied: bool) -> dict[str, list[int]]:
    """Name -> shape of every tensor in the folder's *.safetensors (headers only, no weights loaded).
    With tied embeddings a stored lm_head.weight duplicate is left out (it is read once, as the head)."""
    shapes = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__" or (tied and name.endswith("lm_head.weight")):
                continue
            shapes[name] = meta["shape"]
    if not shapes:
        raise FileNotFoundError(f"no safetensors weights in {model_dir}")
    return shapes


def parameter_count(model_dir: Path, tied: bool) -> int:
    """Elements of all tensors in the folder's *.safetensors (see tensor_shapes)."""
    return sum(math.prod(s) for s in tensor_shapes(model_dir, tied).values())


def find_ref_python(flag: str | None) -> Path | None:
    candidates = [Path(flag)] if flag else [REPO_ROOT / "build" / "ref-venv" / "bin" / "python"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


def parse_batches(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return out


# --------------------------------------------------------------------------- ours


def run_ours_once(llm, prompts: list[list[int]], max_tokens: int, SamplingParams) -> dict:
    eng = llm.engine
    steps: list[tuple[float, float, list[tuple[str, int]]]] = []
    original = eng.step

    def timed_step(*a, **k):
        t0 = time.perf_counter()
        outs = original(*a, **k)
        t1 = time.perf_counter()
        steps.append((t0, t1, [(o.request_id, len(o.token_ids)) for o in outs]))
        return outs

    eng.step = timed_step
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        completions = llm.generate(prompts, params)
        total = time.perf_counter() - t0
    finally:
        del eng.step  # back to the class's method
    b = len(prompts)
    started: set[str] = set()
    k = None
    for i, (_, _, outs) in enumerate(steps):
        started.update(rid for rid, n in outs if n > 0)
        if len(started) == b:
            k = i
            break
    if k is None:
        raise RuntimeError("not every request produced a token")
    prefill_s = steps[k][1] - steps[0][0]
    decode = steps[k + 1:]
    decode_s = (decode[-1][1] - steps[k][1]) if decode else 0.0
    decode_tokens = sum(n for _, _, outs in decode for _, n in outs)
    out_tokens = sum(len(c.token_ids) for c in completions)
    if out_tokens != b * max_tokens:
        raise RuntimeError(f"expected {b * max_tokens} output tokens with ignore_eos, got {out_tokens}")
    return {"batch": b, "prompt_tokens": sum(len(p) for p in prompts), "prefill_s": prefill_s,
            "prefill_steps": k + 1, "decode_s": decode_s, "decode_steps": len(decode),
            "decode_tokens": decode_tokens, "output_tokens": out_tokens, "total_s": total,
            "token_ids": [c.token_ids for c in completions]}


def run_ours(args, prompts: list[list[int]]) -> tuple[dict, list[dict]]:
    from paddle_llm_engine import LLM, SamplingParams

    biggest = max(args.batches)
    budget = max(2048, sum(len(p) for p in prompts[:biggest]))
    t0 = time.perf_counter()
    quant = {"quantization": args.quantization, "quantization_group_size": args.quantization_group_size} \
        if args.quantization else {}
    llm = LLM(str(args.model_dir), device=args.device, num_threads=args.threads,
              max_num_seqs=max(biggest, 1), max_num_batched_tokens=budget, **quant)
    load_s = time.perf_counter() - t0
    info = {"load_s": load_s, "device": str(llm.engine.device), "max_num_batched_tokens": budget,
            "quantization": args.quantization or "none",
            "eos_token_ids": list(llm.engine.eos_token_ids)}
    results = []
    for b in args.batches:
        batch = prompts[:b]
        run_ours_once(llm, batch, min(4, args.max_tokens), SamplingParams)  # warm-up
        runs = [run_ours_once(llm, batch, args.max_tokens, SamplingParams) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["decode_s"] / max(r["decode_tokens"], 1))
        results.append(best)
        print(f"ours: batch {b}: prefill {best['prefill_s']:.3f} s, decode {best['decode_s']:.2f} s "
              f"({best['decode_steps']} steps)", file=sys.stderr, flush=True)
    return info, results


# --------------------------------------------------------------------------- peer


def run_peer(args, prompts: list[list[int]], pad_id: int) -> dict | None:
    ref = find_ref_python(args.ref_python)
    if ref is None:
        tried = args.ref_python or "build/ref-venv/bin/python"
        print(f"note: no reference interpreter ({tried}); skipping the HF transformers peer "
              f"(make one with: bash scripts/setup.sh --reference)", file=sys.stderr)
        return None
    spec = {"model_dir": str(Path(args.model_dir).resolve()), "threads": args.threads,
            "max_new_tokens": args.max_tokens, "batches": args.peer_batches,
            "prompts": prompts[:max(args.peer_batches)], "pad_token_id": pad_id,
            "warmup_tokens": min(4, args.max_tokens)}
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    env.pop("PYTHONPATH", None)
    print(f"peer: {ref} {PEER_SCRIPT.name}", file=sys.stderr, flush=True)
    proc = subprocess.run([str(ref), str(PEER_SCRIPT)], input=json.dumps(spec), text=True,
                          stdout=subprocess.PIPE, env=env, timeout=args.peer_timeout)
    if proc.returncode != 0:
        print(f"note: the peer failed with exit code {proc.returncode}; no peer numbers", file=sys.stderr)
        return None
    out = json.loads(proc.stdout)
    out["python"] = str(ref)
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--batches", type=parse_batches, default=[1, 8, 32], help="our batch sizes, e.g. 1,8,32")
    ap.add_argument("--peer-batches", type=parse_batches, default=[1, 8], help="peer batch sizes")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads for both sides")
    ap.add_argument("--bandwidth-gbs", type=float, default=35.0, help="memory bandwidth for the limit, GB/s")
    ap.add_argument("--device", default="auto", help="our engine's device (auto, cpu, gcu:0)")
    ap.add_argument("--repeats", type=int, default=1, help="measured runs per batch size (best reported)")
    ap.add_argument("--ref-python", default=None,
                    help="interpreter with torch + transformers (default build/ref-venv/bin/python, "
                         "made by: bash scripts/setup.sh --reference)")
    ap.add_argument("--no-peer", action="store_true", help="skip the HF transformers peer")
    ap.add_argument("--peer-timeout", type=float, default=3600.0)
    ap.add_argument("--json", action="store_true", help="print a JSON summary instead of the table")
    ap.add_argument("--quantization", default="", choices=("", "wint8", "wint4"), help="ours: weight-only int8 / int4")
    ap.add_argument("--quantization-group-size", type=int, default=0,
                    help="ours: input channels per scale (0: the default of the quantization, -1: per output channel)")
    args = ap.parse_args(argv)
    if args.max_tokens < 2 or args.repeats < 1 or args.threads < 1:
        ap.error("--max-tokens must be >= 2 (one prefill token plus decode), --repeats and --threads >= 1")
    need = prompts_needed(args)
    if need > len(QUESTIONS):
        ap.error(f"at most {len(QUESTIONS)} distinct prompts are built in (asked for batch {need})")
    return args


def prompts_needed(args) -> int:
    return max(args.batches + ([] if args.no_peer else args.peer_batches))


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        print(f"error: {args.model_dir} has no config.json (run scripts/setup.sh)", file=sys.stderr)
        return 1

    cfg = json.loads((args.model_dir / "config.json").read_text())
    params = parameter_count(args.model_dir, bool(cfg.get("tie_word_embeddings", False)))
    bytes_per_step = params * 4.0
    bandwidth = args.bandwidth_gbs * 1e9

    from paddle_llm_engine.tokenizer import encode_prompt, load_tokenizer

    tok = load_tokenizer(str(args.model_dir))
    prompts = [encode_prompt(tok, q, chat=True) for q in QUESTIONS[:prompts_needed(args)]]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (cfg.get("pad_token_id") or 0)

    # The peer runs first, before our engine exists in this process, so nothing of ours (threads,
    # memory) is around while it runs; the two never run at the same time.
    peer = None
    if not args.no_peer:
        peer = run_peer(args, prompts, int(pad_id))
    info, ours_raw = run_ours(args, prompts)
    summary = {
        "model_dir": str(args.model_dir), "parameters": params, "bytes_per_step": bytes_per_step,
        "bandwidth_gbs": args.bandwidth_gbs, "max_tokens": args.max_tokens, "threads": args.threads,
        "ours": info, "ours_results": [derive(r, bytes_per_step, bandwidth) for r in ours_raw],
        "peer": None, "peer_results": None, "peer_note": None,
    }
    if args.no_peer:
        summary["peer_note"] = "skipped (--no-peer)"
    elif peer is None:
        summary["peer_note"] = "skipped (no reference interpreter or it failed; see stderr)"
    else:
        summary["peer"] = {k: peer[k] for k in ("torch", "transformers", "threads", "python")}
        summary["peer_results"] = peer_rows(peer, ours_raw, info["eos_token_ids"], bytes_per_step, bandwidth)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
