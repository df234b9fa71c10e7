"""Scheduler benchmark: prefix caching, chunked prefill and KV pressure on SmolLM2, offline. One command:

    .venv/bin/python benchmarks/bench_scheduler.py [--model-dir build/SmolLM2-135M-Instruct] [--parts abc]
        [--max-tokens 32] [--threads N] [--time-limit 150] [--json]

Every run drives an LLMEngine directly (the engine behind the offline LLM API), greedy decoding,
one short warm-up request per engine before anything is timed. Numbers are wall-clock on a shared
machine: expect noise.

(a) Prefix cache. 16 chat requests share one ~430-token system prompt and ask different questions;
    all 16 are submitted at once, max_tokens tokens each (EOS ends a request early). Run with
    enable_prefix_caching 1 and 0 (fresh engine each). Printed: prefix-cache hit ratio (prompt
    tokens found in the cache / prompt tokens looked up), prompt tokens actually computed, wall
    time, generated tokens/s, and whether the 16 outputs are identical between the two runs.
    Blocks become reusable once a step has computed them, so the requests admitted in the first
    step (as many as max_num_batched_tokens holds) compute the shared prefix themselves.
(b) Chunked prefill. 4 short chat requests are decoding (max_tokens 2x the flag) when a ~1500-token
    prompt arrives (after 6 steps); run with max_num_batched_tokens 2048 (the whole prompt in one
    step) and 256 (chunks of ~250 tokens next to the decodes). Printed: generated tokens/s, all
    tokens (prompt + generated) per second, the longest gap between two consecutive tokens of the
    4 running requests (the stall the long prefill causes), and the long request's time to first token.
(c) KV pressure. 8 chat requests with num_kv_blocks so small (16 blocks x 16 tokens, max_model_len
    256) that the scheduler must preempt (free and recompute), against the same run with a large
    cache. Printed: preemptions in both runs, and whether the greedy outputs are identical.

--time-limit bounds each run: a run that exceeds it is aborted and reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

SYSTEM_PROMPT = (
    "You are Atlas, the customer support assistant of Northwind Outfitters, an online shop for hiking, "
    "camping and climbing gear. Follow these rules in every answer. "
    "1. Be friendly, precise and brief: answer in at most three sentences unless the customer asks for detail. "
    "2. Orders ship from our warehouse in Lyon within two business days; express delivery takes one to two days "
    "inside the European Union and three to five days elsewhere; standard delivery takes three to seven days. "
    "3. Returns are free within 30 days for unused items in their original packaging; worn shoes and opened "
    "gas canisters cannot be returned for safety reasons. Refunds reach the original payment method within "
    "ten days after the return arrives. "
    "4. Warranty: tents, backpacks and sleeping bags carry a two-year warranty against manufacturing defects; "
    "climbing ropes and harnesses must be retired after five years whatever their condition, and after any "
    "serious fall. Never give advice that could make a climber skip a safety check. "
    "5. Sizes: our boots run half a size small, our jackets follow standard European sizes, and our gloves "
    "come in XS to XL; measure the hand around the knuckles to choose. "
    "6. Payment: we accept cards, bank transfer and gift cards; we never ask for a password or a full card "
    "number in chat, and neither should the customer share one. "
    "7. If a question is about a medical emergency, tell the customer to call the local emergency number. "
    "8. If you do not know the answer, say so and offer to pass the question to a human colleague, who answers "
    "within one business day from Monday to Saturday. "
    "9. Do not invent discount codes, stock levels or delivery dates; stock is shown on each product page. "
    "10. Our loyalty programme gives one point per euro spent; one hundred points give a five euro voucher, "
    "valid for one year. Members get early access to the spring and autumn sales. "
    "11. Always end with a short offer of further help."
)

QUESTIONS = [
    "How long does express delivery to Spain take?",
    "Can I return hiking boots I wore once?",
    "What warranty does a backpack have?",
    "My harness is six years old but looks fine. Can I keep using it?",
    "Which glove size should I choose?",
    "Do you accept PayPal?",
    "How many points do I need for a voucher?",
    "Can you repair the zip of my backpack?",
    "Is there a discount code for students?",
    "How quickly will I get my refund?",
    "Do your boots run true to size?",
    "Can I bring old gear to your store?",
    "When is the next sale?",
    "Can I return an opened gas canister?",
    "Do you ship to Canada?",
    "Is my tent covered if a pole breaks after a year?",
]

RUNNING_QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle gear system works.",
    "Describe the water cycle step by step.",
    "List some tips for learning to play the guitar.",
]

PRESSURE_QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis in simple terms.",
    "Write a haiku about autumn leaves.",
    "How does a binary search work?",
    "Why is the sky blue?",
    "Give me a short recipe for pancakes.",
    "What causes the seasons on Earth?",
    "What is machine learning?",
]


# --------------------------------------------------------------------------- helpers


def chat_ids(tok, user: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(x) for x in ids]


def make_engine(args, **kw):
    from paddle_llm_engine import EngineConfig, LLMEngine

    cfg = dict(model_dir=str(args.model_dir), device=args.device, num_threads=args.threads)
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


class Run:
    """Drives one engine: submits requests (some at a given step), steps until done or the time limit,
    and records per request the tokens, finish reason and the time each token came out."""

    def __init__(self, engine, time_limit: float):
        self.engine = engine
        self.time_limit = time_limit
        self.tokens: dict[str, list[int]] = {}
        self.times: dict[str, list[float]] = {}
        self.arrival: dict[str, float] = {}
        self.reason: dict[str, str | None] = {}
        self.prompt_tokens_computed = 0
        self.tokens_computed = 0
        self.timed_out = False
        self.steps = 0
        self._wrap_scheduler()

    def _wrap_scheduler(self):
        sched = self.engine.scheduler
        original = sched.schedule

        def schedule():
            out = original()
            for s in out.scheduled:
                start, n = s.seq.num_computed_tokens, s.num_new_tokens
                self.tokens_computed += n
                self.prompt_tokens_computed += max(0, min(start + n, s.seq.num_prompt_tokens) - start)
            return out

        sched.schedule = schedule

    def add(self, rid: str, ids: list[int], params) -> None:
        self.tokens[rid], self.times[rid], self.reason[rid] = [], [], None
        self.arrival[rid] = time.perf_counter()
        self.engine.add_request(rid, ids, params)

    def go(self, later: dict[int, list[tuple[str, list[int], object]]] | None = None) -> float:
        """Step to completion; `later` maps a step index to requests added before that step.
        Returns the wall time from the first step to the end."""
        later = dict(later or {})
        t0 = time.perf_counter()
        step = 0
        while self.engine.has_unfinished_requests() or later:
            for rid, ids, params in later.pop(step, []):
                self.add(rid, ids, params)
            outs = self.engine.step()
            now = time.perf_counter()
            step += 1
            self.steps += 1
            for o in outs:
                self.tokens[o.request_id] += o.token_ids
                self.times[o.request_id] += [now] * len(o.token_ids)
                if o.finished:
                    self.reason[o.request_id] = o.finish_reason
            if now - t0 > self.time_limit:
                self.timed_out = True
                for rid in list(self.engine.requests):
                    self.engine.abort_request(rid)
                later.clear()
                break
        return time.perf_counter() - t0

    @property
    def generated(self) -> int:
        return sum(len(t) for t in self.tokens.values())


def warm_up(engine) -> None:
    from paddle_llm_engine import SamplingParams

    engine.add_request("warm-up", list(range(1000, 1040)), SamplingParams(temperature=0.0, max_tokens=4,
                                                                         ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    bm = engine.block_manager
    bm.prefix_query_tokens = bm.prefix_hit_tokens = 0
    engine.scheduler.num_preemptions = 0


def compare(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict:
    same = [rid for rid in a if a[rid] == b.get(rid)]
    diffs = {}
    for rid in a:
        if a[rid] != b.get(rid):
            x, y = a[rid], b.get(rid) or []
            k = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            diffs[rid] = k
    return {"identical": len(same), "total": len(a), "first_difference_at": diffs}


def say(msg: str = "") -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- (a) prefix cache


def part_a(args, tok) -> dict:
    from paddle_llm_engine import SamplingParams

    prompts = {f"q{i}": chat_ids(tok, q, SYSTEM_PROMPT) for i, q in enumerate(QUESTIONS)}
    shared = os.path.commonprefix(list(prompts.values()))
    lens = [len(p) for p in prompts.values()]
    say(f"(a) prefix cache: {len(prompts)} requests submitted at once, shared prefix {len(shared)} tokens, "
        f"prompts {min(lens)}-{max(lens)} tokens ({sum(lens)} in all), greedy, max_tokens {args.max_tokens}, "
        f"block_size {args.block_size}, max_num_batched_tokens 2048")
    res = {"shared_prefix_tokens": len(shared), "prompt_tokens": sum(lens), "runs": {}}
    tokens = {}
    for caching in (1, 0):
        eng = make_engine(args, enable_prefix_caching=caching, block_size=args.block_size, max_num_seqs=16,
                          max_num_batched_tokens=2048, max_model_len=2048)
        warm_up(eng)
        run = Run(eng, args.time_limit)
        for rid, ids in prompts.items():
            run.add(rid, ids, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
        wall = run.go()
        r = {"hit_ratio": eng.block_manager.prefix_cache_hit_ratio, "prompt_tokens_computed": run.prompt_tokens_computed,
             "wall_s": wall, "generated": run.generated, "tokens_per_s": run.generated / wall,
             "steps": run.steps, "timed_out": run.timed_out}
        res["runs"][f"prefix_caching={caching}"] = r
        tokens[caching] = run.tokens
        say(f"    prefix caching {'on ' if caching else 'off'}: hit ratio {r['hit_ratio']:.2f}, prompt tokens computed "
            f"{r['prompt_tokens_computed']} of {sum(lens)}, wall {wall:.1f} s, {r['generated']} tokens generated, "
            f"{r['tokens_per_s']:.1f} tokens/s{'  [TIME LIMIT: aborted]' if run.timed_out else ''}")
        del eng
    cmp = compare(tokens[1], tokens[0])
    res["outputs"] = cmp
    on, off = res["runs"]["prefix_caching=1"], res["runs"]["prefix_caching=0"]
    say(f"    outputs identical with and without the cache: {cmp['identical']}/{cmp['total']}"
        + (f" (first differing token per request: {cmp['first_difference_at']})" if cmp["first_difference_at"] else ""))
    say(f"    speed-up from the cache: {off['wall_s'] / on['wall_s']:.2f}x wall time, prompt tokens computed "
        f"{on['prompt_tokens_computed'] / max(off['prompt_tokens_computed'], 1):.2f}x")
    return res


# --------------------------------------------------------------------------- (b) chunked prefill


def part_b(args, tok) -> dict:
    from paddle_llm_engine import SamplingParams

    running = {f"r{i}": chat_ids(tok, q) for i, q in enumerate(RUNNING_QUESTIONS)}
    lines = ["Summarize the following rules and questions for a new employee."]
    lines += [f"Section {i + 1}. {SYSTEM_PROMPT}" for i in range(3)]
    k = 0
    while len(chat_ids(tok, "\n".join(lines))) < 1500:  # pad with customer questions to ~1500 tokens
        lines.append(f"Customer question {k + 1}: {QUESTIONS[k % len(QUESTIONS)]}")
        k += 1
    long_ids = chat_ids(tok, "\n".join(lines))
    arrive_step = 6
    run_tokens = 2 * args.max_tokens
    say(f"(b) chunked prefill: {len(running)} requests decoding (max_tokens {run_tokens}, EOS ignored) when a "
        f"{len(long_ids)}-token prompt arrives before step {arrive_step} (max_tokens {args.max_tokens})")
    res = {"long_prompt_tokens": len(long_ids), "runs": {}}
    for budget in (2048, 256):
        eng = make_engine(args, enable_prefix_caching=0, max_num_batched_tokens=budget, max_num_seqs=8,
                          max_model_len=2048)
        warm_up(eng)
        run = Run(eng, args.time_limit)
        for rid, ids in running.items():
            run.add(rid, ids, SamplingParams(temperature=0.0, max_tokens=run_tokens, ignore_eos=True))
        long_params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        wall = run.go(later={arrive_step: [("long", long_ids, long_params)]})
        gaps = [b - a for rid in running for a, b in zip(run.times[rid], run.times[rid][1:])]
        all_tokens = sum(len(p) for p in running.values()) + len(long_ids) + run.generated
        ttft = run.times["long"][0] - run.arrival["long"] if run.times.get("long") else float("nan")
        r = {"wall_s": wall, "generated": run.generated, "tokens_per_s": run.generated / wall,
             "all_tokens_per_s": all_tokens / wall, "max_decode_gap_s": max(gaps) if gaps else float("nan"),
             "median_decode_gap_s": sorted(gaps)[len(gaps) // 2] if gaps else float("nan"),
             "long_ttft_s": ttft, "steps": run.steps, "timed_out": run.timed_out}
        res["runs"][f"max_num_batched_tokens={budget}"] = r
        say(f"    max_num_batched_tokens {budget:>4}: {r['tokens_per_s']:.1f} generated tokens/s, "
            f"{r['all_tokens_per_s']:.0f} tokens/s incl. prompts, longest decode gap {r['max_decode_gap_s']:.2f} s "
            f"(median {r['median_decode_gap_s']:.3f} s), long prompt TTFT {ttft:.2f} s, wall {wall:.1f} s"
            f"{'  [TIME LIMIT: aborted]' if run.timed_out else ''}")
        del eng
    return res


# --------------------------------------------------------------------------- (c) KV pressure


def part_c(args, tok) -> dict:
    from paddle_llm_engine import SamplingParams

    prompts = {f"p{i}": chat_ids(tok, q) for i, q in enumerate(PRESSURE_QUESTIONS)}
    need = sum(-(-(len(p) + args.max_tokens) // 16) for p in prompts.values())
    say(f"(c) KV pressure: {len(prompts)} requests, greedy, max_tokens {args.max_tokens}, block_size 16, "
        f"max_model_len 256; they need about {need} blocks in all")
    res = {"blocks_needed": need, "runs": {}}
    tokens = {}
    for blocks in (16, 0):
        eng = make_engine(args, block_size=16, num_kv_blocks=blocks, max_model_len=256, max_num_seqs=8,
                          max_num_batched_tokens=512)
        warm_up(eng)
        run = Run(eng, args.time_limit)
        for rid, ids in prompts.items():
            run.add(rid, ids, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
        wall = run.go()
        r = {"num_kv_blocks": eng.block_manager.num_blocks, "preemptions": eng.scheduler.num_preemptions,
             "tokens_computed": run.tokens_computed, "wall_s": wall, "generated": run.generated,
             "tokens_per_s": run.generated / wall, "timed_out": run.timed_out,
             "blocks_leaked": eng.block_manager.num_blocks - eng.block_manager.num_free_blocks}
        key = "pressure" if blocks else "no_pressure"
        res["runs"][key] = r
        tokens[key] = run.tokens
        say(f"    {r['num_kv_blocks']:>5} blocks: {r['preemptions']} preemptions, {r['tokens_computed']} tokens computed "
            f"(prompt + recompute + decode), wall {wall:.1f} s, {r['tokens_per_s']:.1f} tokens/s, "
            f"blocks still held after the run {r['blocks_leaked']}{'  [TIME LIMIT: aborted]' if run.timed_out else ''}")
        del eng
    cmp = compare(tokens["pressure"], tokens["no_pressure"])
    res["outputs"] = cmp
    say(f"    greedy outputs identical with and without pressure: {cmp['identical']}/{cmp['total']}"
        + (f" (first differing token per request: {cmp['first_difference_at']})" if cmp["first_difference_at"] else ""))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--parts", default="abc", help="which parts to run, e.g. 'ac'")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=64, help="KV block size for part (a)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--time-limit", type=float, default=150.0, help="seconds per run before it is aborted")
    ap.add_argument("--json", action="store_true", help="also print a JSON summary")
    args = ap.parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        print(f"no model in {args.model_dir} (run the project setup, scripts/prepare_model.py)", file=sys.stderr)
        return 2
    import logging

    logging.basicConfig(level=logging.WARNING)
    from paddle_llm_engine.tokenizer import load_tokenizer

    tok = load_tokenizer(str(args.model_dir))
    say(f"model {args.model_dir.name}, {args.threads} threads, device {args.device}")
    summary = {"model_dir": str(args.model_dir), "threads": args.threads, "max_tokens": args.max_tokens}
    t0 = time.perf_counter()
    for part, fn in (("a", part_a), ("b", part_b), ("c", part_c)):
        if part in args.parts:
            summary[part] = fn(args, tok)
    say(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
