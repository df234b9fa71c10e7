"""The child processes of benchmarks/compare.py (`compare.py --worker NAME`, a JSON spec on stdin, a
JSON result on stdout): prepare (token ids of the prompts, long-context passages, EngineConfig's
fields), offline (our LLMEngine, per-token times in seconds) and plot (decode tok/s against streams);
run_worker starts one and reads its result."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from comparison.common import COMPARE_SCRIPT, WARMUP_QUESTION, WARMUP_TOKENS, child_env, load_client, log_tail


def worker_prepare(spec: dict) -> dict:
    """In .venv: token ids of the questions, the ChatML check for `llm`, EngineConfig's field names."""
    import dataclasses

    from paddle_llm_engine.config import EngineConfig, ModelConfig
    from paddle_llm_engine.tokenizer import encode_prompt, load_tokenizer

    tok = load_tokenizer(spec["model_dir"])
    chatml = load_client().chatml
    if spec.get("context_tokens"):
        spec["questions"] = [with_context(tok, q, i, spec["context_tokens"]) for i, q in enumerate(spec["questions"])]
    ids = [encode_prompt(tok, q, chat=True) for q in spec["questions"]]
    mismatch = [i for i, q in enumerate(spec["questions"]) if encode_prompt(tok, chatml(q)) != ids[i]]
    return {"prompt_ids": ids, "questions": spec["questions"], "warmup_ids": encode_prompt(tok, WARMUP_QUESTION, chat=True),
            "chatml_mismatch": mismatch, "engine_fields": [f.name for f in dataclasses.fields(EngineConfig)],
            "eos_token_ids": ModelConfig.from_dir(spec["model_dir"]).eos_token_ids,
            "pad_token_id": tok.pad_token_id if tok.pad_token_id is not None else 0}


def _record_line(i: int, k: int) -> str:
    return (f"Record {i}-{k}: station {chr(65 + (k * 7 + i) % 26)}{(k * 37 + i * 11) % 1000} reported "
            f"{(k * 13 + i * 29) % 97} units at {(k * 5 + i) % 24:02d}:00. ")


def with_context(tok, question: str, i: int, tokens: int) -> str:
    """`question` after a passage of about `tokens` tokens (the whole chat-formatted prompt within a
    few tokens of it): log records whose numbers depend on the question's index i from the first
    one on, so that no two prompts share a prefix block (ours caches whole 64-token blocks; llama.cpp
    runs with cache_prompt off) and a long prompt costs its full prefill on every system."""
    from paddle_llm_engine.tokenizer import encode_prompt

    def build(n):
        return "".join(_record_line(i, k) for k in range(n)) + "\n\nQuestion about the records above: " + question

    lo, hi = 0, 1
    while len(encode_prompt(tok, build(hi), chat=True)) < tokens:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # the most records that stay within `tokens`
        mid = (lo + hi) // 2
        if len(encode_prompt(tok, build(mid), chat=True)) <= tokens:
            lo = mid
        else:
            hi = mid
    return build(lo)


def worker_offline(spec: dict) -> dict:
    """In .venv: our LLMEngine with C requests in flight per level, refilled as they finish."""
    from paddle_llm_engine import LLM, SamplingParams

    t_load = time.perf_counter()
    llm = LLM(spec["model_dir"], **spec["engine_kwargs"])
    engine = llm.engine
    load_s = time.perf_counter() - t_load
    prompts, max_tokens = spec["prompt_ids"], spec["max_tokens"]
    levels = []
    for c in spec["concurrency"]:
        warm = SamplingParams(temperature=0.0, max_tokens=WARMUP_TOKENS, ignore_eos=True)
        for j in range(c):
            engine.add_request(f"warm-{c}-{j}", spec["warmup_ids"], warm)
        while engine.has_unfinished_requests():
            engine.step()
        total = c * spec["requests_per_stream"]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        recs: dict[str, dict] = {}
        nxt = 0
        t0 = time.perf_counter()
        deadline = t0 + spec["duration"]

        def submit(now: float):
            nonlocal nxt
            rid = f"c{c}-{nxt}"
            recs[rid] = {"index": nxt, "sent": now - t0, "times": [], "tokens": [], "final": None, "ids": [],
                         "cut": False}
            engine.add_request(rid, prompts[nxt % len(prompts)], params)
            nxt += 1

        while nxt < min(c, total):
            submit(time.perf_counter())
        while engine.has_unfinished_requests():
            if time.perf_counter() > deadline:
                for rid, r in recs.items():
                    if r["final"] is None:
                        engine.abort_request(rid)
                        r["cut"] = True
                break
            outs = engine.step()
            now = time.perf_counter()
            for o in outs:
                r = recs[o.request_id]
                if o.token_ids:
                    r["times"].append(now - t0)
                    r["tokens"].append(len(o.token_ids))
                    r["ids"].extend(o.token_ids)
                if o.finished:
                    r["final"] = now - t0
                    if nxt < total:
                        submit(now)
        levels.append({"concurrency": c, "t_end": time.perf_counter() - t0, "records": list(recs.values())})
    return {"load_s": load_s, "device": str(engine.device), "levels": levels}


def worker_plot(spec: dict) -> dict:
    """In any venv with matplotlib: decode tok/s against concurrency, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for name, pts in spec["series"].items():
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=name, linestyle="--" if name.startswith("read-bandwidth") else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    xs = sorted({x for pts in spec["series"].values() for x, _ in pts})
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate decode tokens/s")
    ax.set_title(spec["title"], fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(spec["path"])
    return {"path": spec["path"]}


WORKERS = {"prepare": worker_prepare, "offline": worker_offline, "plot": worker_plot}


def run_worker(python: Path | str, name: str, spec: dict, threads: int, timeout: float, log_dir: Path) -> dict:
    """Run `compare.py --worker NAME` under `python` with spec on stdin; its JSON result from stdout.
    The child's stderr goes to <log_dir>/worker-NAME.log (its tail is in the error when it fails)."""
    log_path = log_dir / f"worker-{name}.log"
    with open(log_path, "wb") as err:
        proc = subprocess.run([str(python), str(COMPARE_SCRIPT), "--worker", name], input=json.dumps(spec),
                              stdout=subprocess.PIPE, stderr=err, text=True, env=child_env(threads), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {name} exited with code {proc.returncode}; tail of {log_path}:\n{log_tail(log_path)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
