"""Peer half of benchmarks/bench_engine.py: HF transformers on torch CPU, run in the reference venv.

    build/ref-venv/bin/python benchmarks/hf_transformers_peer.py < spec.json > result.json

bench_engine.py starts this as a subprocess (the reference venv has torch + transformers; the
project venv has paddle) and passes a JSON spec on stdin:
    {"model_dir": str, "threads": int, "max_new_tokens": int, "batches": [int, ...],
     "prompts": [[token ids], ...], "pad_token_id": int, "warmup_tokens": int}
For each batch size B it takes the first B prompts (token ids, already chat-formatted by the caller),
left-pads them into one [B, T] tensor with an explicit attention mask (never a mask derived from pad
ids: SmolLM2's pad id is <|im_end|>, which occurs in every chat prompt), and runs greedy
`model.generate` with max_new_tokens and no EOS stopping (eos_token_id None), so every row makes
exactly max_new_tokens tokens, like our engine's ignore_eos.

Timing: a logits processor records a timestamp each time generate() hands it the logits of a step.
The first call comes right after the prefill forward, so prefill = first call - start; decode = last
call - first call over (calls - 1) steps of B tokens each. Output on stdout, one JSON object:
    {"torch": ver, "transformers": ver, "threads": n, "results": [{"batch", "prompt_tokens",
     "padded_len", "prefill_s", "decode_s", "decode_steps", "total_s", "output_tokens",
     "token_ids": [[...], ...], "step_s": [seconds from the generate call to each step's logits]}, ...]}
(benchmarks/compare.py turns step_s into per-token times: every row of the static batch gets its
token of step k at step_s[k].)
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    spec = json.load(sys.stdin)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList

    torch.set_num_threads(int(spec["threads"]))
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    model.eval()
    pad = int(spec["pad_token_id"])

    class Clock(LogitsProcessor):
        def __init__(self):
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores):
            self.stamps.append(time.perf_counter())
            return scores

    def run(prompts: list[list[int]], new_tokens: int):
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        cfg = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=None, do_sample=False,
                               num_beams=1, eos_token_id=None, pad_token_id=pad, use_cache=True)
        clock = Clock()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                                 logits_processor=LogitsProcessorList([clock]))
            t1 = time.perf_counter()
        gen = out[:, width:].tolist()
        return t0, t1, clock.stamps, gen, width

    results = []
    for b in spec["batches"]:
        prompts = spec["prompts"][:b]
        if spec.get("warmup_tokens"):
            run(prompts, int(spec["warmup_tokens"]))
        t0, t1, stamps, gen, width = run(prompts, int(spec["max_new_tokens"]))
        results.append({
            "batch": b,
            "prompt_tokens": sum(len(p) for p in prompts),
            "padded_len": width,
            "prefill_s": stamps[0] - t0,
            "decode_s": stamps[-1] - stamps[0],
            "decode_steps": len(stamps) - 1,
            "total_s": t1 - t0,
            "output_tokens": sum(len(g) for g in gen),
            "token_ids": gen,
            "step_s": [s - t0 for s in stamps],  # when each step's tokens existed, from the call
        })
        print(f"peer: batch {b} done in {t1 - t0:.2f} s", file=sys.stderr, flush=True)
    json.dump({"torch": torch.__version__, "transformers": transformers.__version__,
               "threads": torch.get_num_threads(), "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
