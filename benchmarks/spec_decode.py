"""N-gram speculative decoding benchmark: decode tok/s at 1 stream with and without speculation, on
an input-grounded workload (rewrite / extract from a given passage, code edit: the answer copies
much of the prompt) and a chat workload (questions: little to copy). One command:

    .venv/bin/python benchmarks/spec_decode.py [--model-dir build/SmolLM2-135M-Instruct] [--threads N]
        [--max-tokens 160] [--k 4] [--lookup-min 2] [--lookup-max 4] [--json]

One engine (speculative_method "ngram"); the run without speculation sets its scheduler's proposer
to None, so both runs share the process, the weights and the warm caches. Requests one at a time
(1 stream), greedy, EOS honoured, chat template applied. Per request: decode time = last token time
- first token time, decode tokens = output tokens - 1; a workload's decode tok/s = sum of decode
tokens / sum of decode times. Acceptance = accepted / proposed draft tokens (the engine's
spec-decode counters); tokens per verify = 1 + accepted / drafts. The greedy outputs of both runs are
compared (equal unless a near-tie flips under the different batching of the verify step).
Each workload is warmed up once (first request) before timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "backend"))
sys.path.insert(0, str(REPO_ROOT / "ops"))

PASSAGE = (
    "The city council met on Tuesday evening to discuss the new public library. The building, which "
    "will be located on Main Street next to the old post office, is expected to open in the spring of "
    "next year. Council member Anna Lopez said the library will have a large children's section, a "
    "computer lab with forty workstations, and a community room that local groups can reserve for free. "
    "The project will cost about twelve million dollars, most of which comes from a state grant. Some "
    "residents raised concerns about parking, since the lot behind the post office has only sixty spaces. "
    "The council agreed to study the parking question and report back at the next meeting in March.")
CODE = '''def load_items(path):
    items = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, count = line.split(",")
            items.append((name, int(count)))
    return items


def total_count(items):
    total = 0
    for name, count in items:
        total += count
    return total
'''
GROUNDED = [
    f"Rewrite the following passage exactly, but replace every number written in words with digits:\n\n{PASSAGE}",
    f"Copy the following passage and put each sentence on its own line:\n\n{PASSAGE}",
    f"Extract, word for word, every sentence of this passage that mentions the council:\n\n{PASSAGE}",
    f"Rename the variable `items` to `records` everywhere in this Python code and return the full code:\n\n"
    f"```python\n{CODE}```",
    f"Add a docstring to each function of this Python code and return the whole file:\n\n```python\n{CODE}```",
]
CHAT = [
    "What is the capital of France?",
    "Explain photosynthesis in simple terms.",
    "Write a haiku about autumn leaves.",
    "What are three tips for staying productive when working from home?",
    "Give me a short recipe for pancakes.",
]


def run_workload(engine, prompts, params, speculate: bool, proposer) -> dict:
    engine.scheduler.proposer = proposer if speculate else None
    s0 = engine.stats()
    dec_tokens, dec_s, outputs = 0, 0.0, []
    for i, ids in enumerate(prompts):
        rid = f"{'s' if speculate else 'p'}{i}-{time.monotonic_ns()}"
        engine.add_request(rid, ids, params)
        first = last = None
        toks = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.token_ids:
                    now = time.perf_counter()
                    first = now if first is None else first
                    last = now
                    toks += out.token_ids
        outputs.append(toks)
        dec_tokens += len(toks) - 1
        dec_s += last - first
    s1 = engine.stats()
    drafts = s1.spec_num_drafts - s0.spec_num_drafts
    proposed = s1.spec_num_draft_tokens - s0.spec_num_draft_tokens
    accepted = s1.spec_num_accepted_tokens - s0.spec_num_accepted_tokens
    return {"decode_tokens": dec_tokens, "decode_s": dec_s, "tok_s": dec_tokens / dec_s if dec_s else 0.0,
            "drafts": drafts, "draft_tokens": proposed, "accepted_tokens": accepted,
            "acceptance": accepted / proposed if proposed else 0.0,
            "tokens_per_verify": 1 + accepted / drafts if drafts else 0.0, "outputs": outputs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=str(REPO_ROOT / "build" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--lookup-min", type=int, default=2)
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model_dir=args.model_dir, device="cpu", num_threads=args.threads,
                                    max_num_seqs=4, speculative_method="ngram", num_speculative_tokens=args.k,
                                    prompt_lookup_min=args.lookup_min, prompt_lookup_max=args.lookup_max,
                                    enable_prefix_caching=0))
    proposer = engine.scheduler.proposer
    tok = engine.tokenizer

    def chat(q):
        text = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        return tok.encode(text, add_special_tokens=False)

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    summary = {"model_dir": args.model_dir, "k": args.k, "lookup": [args.lookup_min, args.lookup_max],
               "max_tokens": args.max_tokens, "workloads": {}}
    for name, questions in (("grounded", GROUNDED), ("chat", CHAT)):
        prompts = [list(chat(q)) for q in questions]
        run_workload(engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), False, proposer)  # warm-up
        run_workload(engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), True, proposer)
        off = run_workload(engine, prompts, params, False, proposer)
        on = run_workload(engine, prompts, params, True, proposer)
        same = sum(a == b for a, b in zip(off["outputs"], on["outputs"]))
        summary["workloads"][name] = {"off": {k: v for k, v in off.items() if k != "outputs"},
                                      "on": {k: v for k, v in on.items() if k != "outputs"},
                                      "speedup": on["tok_s"] / off["tok_s"] if off["tok_s"] else 0.0,
                                      "identical_outputs": f"{same}/{len(prompts)}"}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"n-gram speculation, k={args.k}, lookup {args.lookup_min}..{args.lookup_max}, 1 stream, greedy, "
          f"max_tokens {args.max_tokens}")
    print(f"{'workload':10} {'off tok/s':>10} {'on tok/s':>10} {'speedup':>8} {'accept':>7} {'tok/verify':>10} "
          f"{'drafts':>7} {'same out':>8}")
    for name, w in summary["workloads"].items():
        print(f"{name:10} {w['off']['tok_s']:10.1f} {w['on']['tok_s']:10.1f} {w['speedup']:8.2f} "
              f"{w['on']['acceptance']:7.2f} {w['on']['tokens_per_verify']:10.2f} {w['on']['drafts']:7d} "
              f"{w['identical_outputs']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
