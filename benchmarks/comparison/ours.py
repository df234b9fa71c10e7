"""Our engine as benchmarks/compare.py runs it: offline (an LLMEngine in a worker child, C requests in
flight) and through one tritonserver (`llm` and `ensemble` over gRPC streams with
client_examples/load_client.run_load, the OpenAI frontend beside it over HTTP), level by level.
Each returns its levels' statistics (measure.summarize); offline also its token ids."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from comparison.common import (LABELS, REPO_ROOT, TRITON, WARMUP_QUESTION, WARMUP_TOKENS, child_env, launcher,
                               load_client, log, repo_edit)
from comparison.measure import make_record, summarize
from comparison.report import print_level_progress
from comparison.traffic import openai_load
from comparison.workers import run_worker


def run_offline(ctx) -> dict:
    a = ctx.args
    spec = {"model_dir": str(a.model_dir), "engine_kwargs": ctx.engine_kwargs, "prompt_ids": ctx.prompt_ids,
            "warmup_ids": ctx.warmup_ids, "max_tokens": a.max_tokens, "concurrency": a.concurrency,
            "requests_per_stream": a.requests_per_stream, "duration": a.duration}
    out = run_worker(sys.executable, "offline", spec, a.threads, ctx.child_timeout, ctx.out_dir)
    levels = {}
    for lv in out["levels"]:
        recs = [make_record(r["index"], r["sent"], r["times"], r["tokens"], r["final"], cut=r["cut"])
                for r in lv["records"]]
        levels[lv["concurrency"]] = {**summarize(recs, 0.0, lv["t_end"]),
                                     "token_ids": [r["ids"] for r in sorted(lv["records"], key=lambda r: r["index"])]}
    return {"levels": levels, "info": f"LLMEngine, engine load {out['load_s']:.1f} s, device {out['device']}"}


def bench_model_repository(ctx) -> Path:
    """A copy of model_repository/ under <out-dir> with the engine settings of this run in `llm`."""
    repo = ctx.out_dir / "model_repository"
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(REPO_ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = repo / "llm" / "config.pbtxt"
    for key, value in {**ctx.engine_kwargs, **ctx.serving_params}.items():
        repo_edit().set_config_parameter(cfg, key, str(int(value) if isinstance(value, bool) else value))
    return repo


def run_triton(ctx, models: list[str]) -> dict:
    """One tritonserver for `llm`, `ensemble` and the OpenAI frontend (started beside it when "openai" is
    in models); level by level: at each concurrency the models in TRITON order."""
    a = ctx.args
    la = launcher()
    ports: list[int] = []
    while len(ports) < 4:
        p = la.free_port()
        if p not in ports:
            ports.append(p)
    log_path = ctx.out_dir / "tritonserver.log"
    repo = bench_model_repository(ctx)
    server = la.start_server(repo, *ports[:3], model_dir=a.model_dir, log_path=log_path, env=child_env(a.threads))
    frontend = None
    levels: dict[str, dict] = {m: {} for m in models}
    info = {}
    try:
        ready = server.wait_ready(timeout=300)
        log(f"tritonserver ready after {ready:.1f} s (log {log_path})")
        for m in models:
            info[m] = f"tritonserver (ready after {ready:.1f} s), gRPC streaming"
        if "openai" in models:
            frontend = start_openai_frontend(ctx, ports)
            fe_ready = frontend.wait_ready(120)
            log(f"OpenAI frontend ready after {fe_ready:.1f} s at {frontend.url}")
            info["openai"] = (f"paddle_llm_openai at {frontend.url} in front of the same tritonserver, POST /v1/completions "
                              f"streamed (SSE), the `llm` ChatML text")
        for c in a.concurrency:
            for model in [m for m in TRITON if m in models]:
                levels[model][c] = (openai_level(ctx, frontend, c) if model == "openai"
                                    else grpc_level(ctx, server.grpc_url, model, c))
                print_level_progress(model, c, levels[model][c])
    finally:
        if frontend is not None:
            log(f"OpenAI frontend stopped (exit code {frontend.stop(15)})")
        code = server.stop()
        log(f"tritonserver stopped (exit code {code}{', killed by the watchdog' if server.killed else ''})")
    return {m: {"levels": levels[m], "info": info[m]} for m in models if levels[m]}


def start_openai_frontend(ctx, ports: list[int]):
    """paddle_llm_openai on ports[3] in front of the tritonserver started on ports[:3] (not yet ready:
    the caller waits, so that it stops a frontend that never gets ready)."""
    from paddle_llm_launcher.frontend import start_frontend

    return start_frontend(ports[1], ports[2], ports[3], ctx.args.model_dir,
                          log_path=ctx.out_dir / "openai_frontend.log", drain_grace=5.0, log=log)


def openai_level(ctx, frontend, c: int) -> dict:
    """One level on the OpenAI frontend: warm-up, then c streams of the `llm` ChatML text."""
    a, lg = ctx.args, load_client()
    chat = [lg.chatml(q) for q in ctx.questions]
    openai_load(frontend.base, [lg.chatml(WARMUP_QUESTION)], c, c, WARMUP_TOKENS, a.duration)
    log(f"{LABELS['openai']}: {c} stream(s)")
    raw, t0, t_end = openai_load(frontend.base, chat, c, c * a.requests_per_stream, a.max_tokens, a.duration)
    raw.sort(key=lambda x: x[0])
    recs = [make_record(i, r["sent"], r["times"], r["tokens"], r["final"], r["error"], r["cut"]) for i, r in raw]
    return summarize(recs, t0, t_end)


def grpc_level(ctx, url: str, model: str, c: int) -> dict:
    """One level on `llm` or `ensemble` over gRPC streams (load_client.run_load): warm-up, then c streams;
    exactly max_tokens per request (`llm`: ignore_eos; `ensemble`: min_tokens = max_tokens)."""
    a, lg = ctx.args, load_client()
    base = dict(url=url, model=model, max_tokens=a.max_tokens, temperature=0.0, top_p=1.0,
                seed=None, warmup=0, timeout=a.duration, ignore_eos=model == "llm",
                min_tokens=a.max_tokens if model == "ensemble" else 0)
    warm = argparse.Namespace(**{**base, "max_tokens": WARMUP_TOKENS, "ignore_eos": model == "llm",
                                 "min_tokens": WARMUP_TOKENS if model == "ensemble" else 0},
                              concurrency=c, requests=c, duration=a.duration, prompts=[WARMUP_QUESTION])
    lg.run_load(warm)
    run = argparse.Namespace(**base, concurrency=c, requests=c * a.requests_per_stream,
                             duration=a.duration, prompts=ctx.questions)
    log(f"{LABELS[model]}: {c} stream(s)")
    return lg.run_load(run)
