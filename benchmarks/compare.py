"""Side-by-side benchmark: our engine (offline, through Triton `llm`, through Triton `ensemble`, through
the OpenAI frontend) and its peers (HF transformers, llama.cpp's server on F32 and Q8_0 GGUFs of the
same weights), one command:

    .venv/bin/python benchmarks/compare.py [--quick] [--concurrency 1,8,32] [--max-tokens 128]
        [--requests-per-stream 1] [--threads 2] [--context-tokens 0]
        [--systems offline,llm,ensemble,openai,hf,llamacpp-f32,llamacpp-q8_0]
        [--quantization wint8] [--engine-kwargs '{"kernels": "composed"}'] [--duration 900] [--out-dir build/bench]

--quick: 16 tokens at 1 and 2 streams, 60 s cap per level (a check that every system runs, not a
measurement). Nothing is ever run at the same time: the systems run one after another, each in a
process of its own that is gone before the next starts (our offline engine in a child of .venv, the
tritonserver through paddle_llm_launcher, HF transformers in build/ref-venv, llama.cpp in
build/peer-venv); only the load clients run in this process, against loopback ports.

Workload (the same for every system): the chat-formatted questions of benchmarks/bench_engine.py,
request i asking question i mod 32, greedy, exactly --max-tokens tokens per request with EOS ignored
(ours offline, `llm` and the OpenAI frontend: ignore_eos; `ensemble`: min_tokens = max_tokens, the
TensorRT-LLM names having no ignore_eos; HF: eos_token_id None; llama.cpp: ignore_eos). At each concurrency C, C streams each send
--requests-per-stream requests one after another (offline: C requests in flight in one LLMEngine,
refilled as they finish; HF: static batches of C, run back to back). Before each level C warm-up
requests of 4 tokens run on a question that is not measured. Prompt tokens: the offline engine,
HF and llama.cpp get the same token ids (the tokenizer's chat template); `llm` gets the same text
in ChatML (checked to tokenize to the same ids) and `ensemble` the question with apply_chat_template;
"ours OpenAI" (paddle_llm_openai, started beside the same tritonserver as `make serve` starts it) gets
the same ChatML text as `llm` on POST /v1/completions, streamed (SSE, stream_options.include_usage),
so its engine work is exactly `llm`'s and the ratio OpenAI / llm is the frontend's overhead (issue 18
asks >= 0.95x at 1 / 8 / 32 streams). The Triton systems run on one tritonserver, level by level
(at each concurrency: llm, ensemble, OpenAI), so a drifting machine load hits them alike.
llama.cpp runs with cache_prompt off: our prefix cache reuses only whole 64-token blocks, which these
~40-token prompts never fill, so neither side reuses the shared system prompt.

Threads: --threads (default 2) for every system, set explicitly: EngineConfig.num_threads / the `llm`
config.pbtxt num_threads, torch.set_num_threads, llama.cpp n_threads and n_threads_batch, plus
OMP_NUM_THREADS / MKL_NUM_THREADS in every child's environment. Bounds: each level has a fixed number
of requests and a time cap (--duration; requests still running at the cap are cut and reported);
every child process has a timeout.

Measured, the same way for every system (client_examples/load_generator.py's summarize_records, fed
with per-token arrival times: gRPC responses, llama.cpp and OpenAI SSE events, our engine's step
ends, HF's step clock; an OpenAI chunk counts one token, the last one whatever remains of the usage's
completion_tokens):
- decode tok/s (aggregate): tokens after each request's first / the time during which at least one
  request was between its first and its last token;
- TTFT: send -> first token; ITL: per-token gaps after the first; p50 / p90 / p99 over all requests;
- of limit: decode tok/s / (C * read bandwidth / bytes of weights read per step), the bandwidth
  measured here with numpy (float64 sum over a 1 GiB array split over --threads threads, best of 5),
  the bytes from the safetensors headers (fp32; a tied embedding counts once as the lm head) or the
  Q8_0 GGUF's tensor data;
- ratios: each of ours (offline, llm, ensemble) to each peer, and llm / ensemble to offline.
Output: tables on stdout, <out-dir>/compare.md (Markdown for docs/benchmarks/results.md), compare.png (decode tok/s
against concurrency), compare.json (everything).

Long contexts (--context-tokens N, issue 17): every prompt is a passage of about N tokens of log
records followed by its question, different per question from the first record on (no shared
prefix block); TTFT is then the prefill of N tokens and decode runs over N tokens of KV. E.g.
`--context-tokens 2000 --concurrency 1 --max-tokens 16 --requests-per-stream 3` (TTFT) and
`--context-tokens 4000 --concurrency 1 --max-tokens 128` (decode at 4,000 tokens of context).

Set-up on first use (idempotent, cached): build/peer-venv with the pinned xllamacpp wheel (and
matplotlib if .venv has none), the F32 / Q8_0 GGUFs by benchmarks/gguf_export.py under
<out-dir>/gguf. HF transformers needs build/ref-venv (`bash scripts/setup.sh --reference`); a peer
that is missing or fails is skipped with a note and the rest still runs.

--quantization Q / --engine-kwargs JSON: EngineConfig fields for ours (offline: LLM kwargs; Triton: the
`llm` model's config.pbtxt parameters of the same names). A name EngineConfig does not have is an
error before anything runs (e.g. quantization, until weight-only int8 exists).
--serving-params JSON: `llm` config.pbtxt parameters that are not engine settings (config_params.py
ServingOptions, e.g. '{"stream_interval": 4}'); Triton systems only, an unknown name is an error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
PEER_VENV = REPO_ROOT / "build" / "peer-venv"
PEER_PINS = ["xllamacpp==2026.10.11549"]
PLOT_PINS = ["matplotlib==3.11.2"]  # only when .venv has no matplotlib
WARMUP_QUESTION = "Say hello in one word."
WARMUP_TOKENS = 4

SYSTEMS = ("offline", "llm", "ensemble", "openai", "hf", "llamacpp-f32", "llamacpp-q8_0")
OURS = ("offline", "llm", "ensemble", "openai")
TRITON = ("llm", "ensemble", "openai")  # run on one tritonserver (openai: the frontend beside it)
LABELS = {"offline": "ours offline", "llm": "ours Triton llm", "ensemble": "ours Triton ensemble",
          "openai": "ours OpenAI", "hf": "HF transformers", "llamacpp-f32": "llama.cpp F32",
          "llamacpp-q8_0": "llama.cpp Q8_0"}


# --------------------------------------------------------------------------- sibling modules


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def bench_engine():
    return _load("bench_engine", BENCH_DIR / "bench_engine.py")


def load_generator():
    return _load("load_generator", REPO_ROOT / "client_examples" / "load_generator.py")


def gguf_export():
    return _load("gguf_export", BENCH_DIR / "gguf_export.py")


def repo_edit():
    return _load("repo_edit", REPO_ROOT / "tests" / "e2e" / "repo_edit.py")


def launcher():
    import paddle_llm_launcher as mod

    return mod


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)
    return env


def log(msg: str) -> None:
    print(f"compare: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- host


def host_info(threads: int) -> dict:
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model in ("unknown", platform.processor()):
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return {"cpu": model, "isa": isa, "cores": os.cpu_count(), "threads": threads,
            "kernel": platform.release(), "python": platform.python_version()}


def measure_bandwidth(threads: int, gib: float = 1.0, repeats: int = 5) -> dict:
    """Read bandwidth: float64 sum of a `gib` GiB array split into `threads` parts, one thread each
    (numpy releases the GIL in the reduction); best of `repeats`, bytes / seconds."""
    import numpy as np

    a = np.ones(int(gib * (1 << 30)) // 8, dtype=np.float64)  # ones: every page touched before timing
    parts = np.array_split(a, threads)
    best = math.inf
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)
        ths = [threading.Thread(target=lambda p=p: (barrier.wait(), p.sum())) for p in parts]
        for t in ths:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in ths:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return {"bytes_per_s": a.nbytes / best, "array_bytes": a.nbytes, "threads": threads, "repeats": repeats,
            "method": f"numpy float64 sum over {a.nbytes / (1 << 30):g} GiB in {threads} thread(s), best of {repeats}"}


def wint8_bytes_estimate(model_dir: Path, tied: bool) -> int:
    """Bytes per decode step if every 2-D weight were int8 with one fp32 scale per output row and the
    rest fp32 (weight-only int8 as planned: for the limit of a --quantization wint8 run)."""
    return sum(math.prod(s) + 4 * s[0] if len(s) == 2 else 4 * math.prod(s)
               for s in bench_engine().tensor_shapes(model_dir, tied).values())


# --------------------------------------------------------------------------- peer venv


def _base_python() -> str:
    return getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable


def ensure_peer_venv(pins: list[str]) -> Path:
    """build/peer-venv with `pins` installed (idempotent: a stamp lists what was installed).
    Raises RuntimeError with pip's last lines when an install fails."""
    py = PEER_VENV / "bin" / "python"
    stamp = PEER_VENV / ".installed.json"
    have = json.loads(stamp.read_text()) if stamp.is_file() and py.is_file() else []
    missing = [p for p in pins if p not in have]
    if not missing:
        return py
    if not py.is_file():
        base = _base_python()
        log(f"creating {PEER_VENV} with {base}")
        subprocess.run([base, "-m", "venv", str(PEER_VENV)], check=True, timeout=300)
    log(f"installing {' '.join(missing)} into {PEER_VENV}")
    proc = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", *missing],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-8:])
        raise RuntimeError(f"pip install {' '.join(missing)} into {PEER_VENV} failed:\n{tail}")
    stamp.write_text(json.dumps(sorted(set(have) | set(missing))) + "\n")
    return py


# --------------------------------------------------------------------------- records


def make_record(index: int, sent: float, times: list[float], tokens: list[int], final: float | None,
                error: str | None = None, cut: bool = False):
    rec = load_generator().RequestRecord(index)
    rec.sent, rec.times, rec.tokens, rec.final, rec.error, rec.cut = sent, times, tokens, final, error, cut
    return rec


def summarize(records, t0: float, t_end: float) -> dict:
    return load_generator().summarize_records(records, t0, t_end, prompt_tokens=False)


# --------------------------------------------------------------------------- workers (child processes)


def worker_prepare(spec: dict) -> dict:
    """In .venv: token ids of the questions, the ChatML check for `llm`, EngineConfig's field names."""
    import dataclasses

    from paddle_llm_engine.config import EngineConfig, ModelConfig
    from paddle_llm_engine.tokenizer import encode_prompt, load_tokenizer

    tok = load_tokenizer(spec["model_dir"])
    chatml = load_generator().chatml
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


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""


def run_worker(python: Path | str, name: str, spec: dict, threads: int, timeout: float, log_dir: Path) -> dict:
    """Run `compare.py --worker NAME` under `python` with spec on stdin; its JSON result from stdout.
    The child's stderr goes to <log_dir>/worker-NAME.log (its tail is in the error when it fails)."""
    log_path = log_dir / f"worker-{name}.log"
    with open(log_path, "wb") as err:
        proc = subprocess.run([str(python), str(Path(__file__).resolve()), "--worker", name], input=json.dumps(spec),
                              stdout=subprocess.PIPE, stderr=err, text=True, env=child_env(threads), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {name} exited with code {proc.returncode}; tail of {log_path}:\n{log_tail(log_path)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- systems


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
    lg = load_generator()
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
            from paddle_llm_launcher.frontend import start_frontend

            frontend = start_frontend(ports[1], ports[2], ports[3], a.model_dir, log_path=ctx.out_dir / "openai_frontend.log",
                                      drain_grace=5.0, log=log)
            fe_ready = frontend.wait_ready(120)
            log(f"OpenAI frontend ready after {fe_ready:.1f} s at {frontend.url}")
            info["openai"] = (f"paddle_llm_openai at {frontend.url} in front of the same tritonserver, POST /v1/completions "
                              f"streamed (SSE), the `llm` ChatML text")
        for c in a.concurrency:
            for model in [m for m in TRITON if m in models]:
                if model == "openai":
                    chat = [lg.chatml(q) for q in ctx.questions]
                    openai_load(frontend.base, [lg.chatml(WARMUP_QUESTION)], c, c, WARMUP_TOKENS, a.duration)
                    log(f"{LABELS[model]}: {c} stream(s)")
                    raw, t0, t_end = openai_load(frontend.base, chat, c, c * a.requests_per_stream, a.max_tokens,
                                                 a.duration)
                    raw.sort(key=lambda x: x[0])
                    recs = [make_record(i, r["sent"], r["times"], r["tokens"], r["final"], r["error"], r["cut"])
                            for i, r in raw]
                    levels[model][c] = summarize(recs, t0, t_end)
                    print_level_progress(model, c, levels[model][c])
                    continue
                base = dict(url=server.grpc_url, model=model, max_tokens=a.max_tokens, temperature=0.0, top_p=1.0,
                            seed=None, warmup=0, timeout=a.duration, ignore_eos=model == "llm",
                            min_tokens=a.max_tokens if model == "ensemble" else 0)
                warm = argparse.Namespace(**{**base, "max_tokens": WARMUP_TOKENS, "ignore_eos": model == "llm",
                                             "min_tokens": WARMUP_TOKENS if model == "ensemble" else 0},
                                          concurrency=c, requests=c, duration=a.duration, prompts=[WARMUP_QUESTION])
                lg.run_load(warm)
                run = argparse.Namespace(**base, concurrency=c, requests=c * a.requests_per_stream,
                                         duration=a.duration, prompts=ctx.questions)
                log(f"{LABELS[model]}: {c} stream(s)")
                levels[model][c] = lg.run_load(run)
                print_level_progress(model, c, levels[model][c])
    finally:
        if frontend is not None:
            log(f"OpenAI frontend stopped (exit code {frontend.stop(15)})")
        code = server.stop()
        log(f"tritonserver stopped (exit code {code}{', killed by the watchdog' if server.killed else ''})")
    return {m: {"levels": levels[m], "info": info[m]} for m in models if levels[m]}


def run_hf(ctx) -> dict:
    a = ctx.args
    be = bench_engine()
    ref = be.find_ref_python(a.ref_python)
    if ref is None:
        raise RuntimeError("no build/ref-venv/bin/python (make it with: bash scripts/setup.sh --reference)")
    batches = [c for c in a.concurrency for _ in range(a.requests_per_stream)]
    spec = {"model_dir": str(Path(a.model_dir).resolve()), "threads": a.threads, "max_new_tokens": a.max_tokens,
            "batches": batches, "prompts": ctx.prompt_ids[:max(a.concurrency)], "pad_token_id": ctx.pad_token_id,
            "warmup_tokens": WARMUP_TOKENS}
    log_path = ctx.out_dir / "hf_transformers_peer.log"
    with open(log_path, "wb") as err:
        proc = subprocess.run([str(ref), str(BENCH_DIR / "hf_transformers_peer.py")], input=json.dumps(spec), text=True,
                              stdout=subprocess.PIPE, stderr=err, env=child_env(a.threads), timeout=ctx.child_timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"hf_transformers_peer.py exited with code {proc.returncode}; tail of {log_path}:\n"
                           f"{log_tail(log_path)}")
    out = json.loads(proc.stdout)
    if "step_s" not in out["results"][0]:
        raise RuntimeError("hf_transformers_peer.py did not report step_s (an older copy?)")
    levels = {}
    by_c: dict[int, list] = {}
    for r in out["results"]:
        by_c.setdefault(r["batch"], []).append(r)
    for c, waves in by_c.items():
        recs, offset, ids = [], 0.0, []
        for w, r in enumerate(waves):  # static batches back to back: wave w starts when w-1 ended
            for j in range(c):
                times = [offset + s for s in r["step_s"]]
                recs.append(make_record(w * c + j, offset, times, [1] * len(times), times[-1]))
            ids.extend(r["token_ids"])
            offset += r["step_s"][-1]
        levels[c] = {**summarize(recs, 0.0, offset), "token_ids": ids}
    return {"levels": levels, "info": f"transformers {out['transformers']}, torch {out['torch']}, "
                                      f"{out['threads']} threads, static batch ({ref})"}


class LlamaCppServer:
    """benchmarks/llamacpp_peer.py in the peer venv; stopped by closing its stdin (then killed)."""

    def __init__(self, python: Path, gguf: str, threads: int, parallel: int, ctx_per_slot: int, max_seconds: float,
                 log_path: Path):
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [str(python), str(BENCH_DIR / "llamacpp_peer.py"), "--model", gguf, "--threads", str(threads),
             "--parallel", str(parallel), "--ctx-per-slot", str(ctx_per_slot), "--max-seconds", str(max_seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=child_env(threads),
            start_new_session=True)
        self.info = None

    def wait_ready(self, timeout: float) -> dict:
        box: list = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not box or not box[0]:
            raise RuntimeError(f"llama.cpp server not ready after {timeout:.0f} s (exit code {self.proc.poll()}; "
                               f"log {self.log.name})")
        self.info = json.loads(box[0])
        return self.info

    def stop(self) -> int:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            code = self.proc.wait()
        self.log.close()
        return code


def llamacpp_request(address: str, ids: list[int], max_tokens: int, timeout: float, deadline: float) -> dict:
    """One streamed /completion request; per-token arrival times (perf_counter) from the SSE events."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(address)
    body = json.dumps({"prompt": ids, "n_predict": max_tokens, "stream": True, "ignore_eos": True,
                       "temperature": 0.0, "top_k": 1, "cache_prompt": False, "return_tokens": True})
    rec = {"sent": time.perf_counter(), "times": [], "tokens": [], "final": None, "ids": [], "error": None,
           "cut": False}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read(300)!r}"
            return rec
        while True:
            if time.perf_counter() > deadline:
                rec["cut"] = True
                return rec
            line = resp.readline()
            if not line:
                rec["error"] = "stream ended without a final event"
                return rec
            if not line.startswith(b"data: "):
                continue
            now = time.perf_counter()
            ev = json.loads(line[6:])
            toks = ev.get("tokens")
            n = len(toks) if toks is not None else (1 if ev.get("content") else 0)
            if n:
                rec["times"].append(now)
                rec["tokens"].append(n)
                rec["ids"].extend(toks or [])
            if ev.get("stop"):
                rec["final"] = now
                return rec
    except OSError as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    finally:
        conn.close()


def openai_request(base: str, prompt: str, max_tokens: int, timeout: float, deadline: float) -> dict:
    """One streamed POST /v1/completions to the OpenAI frontend at `base` (http://host:port): greedy,
    exactly max_tokens tokens (ignore_eos), usage in the last chunk. Per-chunk arrival times
    (perf_counter); a chunk with text counts one token, the last one also whatever the usage's
    completion_tokens says is left (a chunk can carry more than one token)."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(base)
    body = json.dumps({"model": "llm", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    rec = {"sent": time.perf_counter(), "times": [], "tokens": [], "final": None, "ids": [], "error": None,
           "cut": False}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    usage = None
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read(300)!r}"
            return rec
        while True:
            if time.perf_counter() > deadline:
                rec["cut"] = True
                return rec
            line = resp.readline()
            if not line:
                rec["error"] = "stream ended without data: [DONE]"
                return rec
            if not line.startswith(b"data: "):
                continue
            now = time.perf_counter()
            if line.strip() == b"data: [DONE]":
                rec["final"] = now
                if usage is not None and rec["tokens"] and usage > sum(rec["tokens"]):
                    rec["tokens"][-1] += usage - sum(rec["tokens"])
                return rec
            ev = json.loads(line[6:])
            if "error" in ev:
                rec["error"] = f"error event: {ev['error']}"
                return rec
            if ev.get("usage"):
                usage = ev["usage"].get("completion_tokens")
            if any(ch.get("text") for ch in ev.get("choices") or []):
                rec["times"].append(now)
                rec["tokens"].append(1)
    except OSError as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    finally:
        conn.close()


def openai_load(base: str, prompts: list[str], concurrency: int, requests: int, max_tokens: int,
                duration: float) -> tuple[list, float, float]:
    """llamacpp_load's client threads with openai_request."""
    return llamacpp_load(base, prompts, concurrency, requests, max_tokens, duration, request_fn=openai_request)


def llamacpp_load(address: str, prompts: list, concurrency: int, requests: int, max_tokens: int,
                  duration: float, request_fn=None) -> tuple[list, float, float]:
    """`concurrency` client threads, each sending its requests one after another, `requests` in all
    (request_fn(address, prompt, max_tokens, timeout, deadline) -> record dict; llamacpp_request
    by default)."""
    request_fn = request_fn or llamacpp_request
    lock = threading.Lock()
    counter = {"next": 0}
    out: list[tuple[int, dict]] = []
    t0 = time.perf_counter()
    deadline = t0 + duration

    def worker():
        while time.perf_counter() < deadline:
            with lock:
                i = counter["next"]
                if i >= requests:
                    return
                counter["next"] += 1
            r = request_fn(address, prompts[i % len(prompts)], max_tokens, duration, deadline)
            with lock:
                out.append((i, r))
            if r["cut"]:
                return

    ths = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(duration + 60)
    return out, t0, time.perf_counter()


def run_llamacpp(ctx, qtype: str) -> dict:
    a = ctx.args
    py = ensure_peer_venv(PEER_PINS)
    info = gguf_export().ensure_gguf(a.model_dir, ctx.out_dir / "gguf", qtype)
    longest = max(len(p) for p in ctx.prompt_ids)
    per_slot = 256 * math.ceil((longest + a.max_tokens + 16) / 256)
    server = LlamaCppServer(py, info["path"], a.threads, max(a.concurrency), per_slot, ctx.child_timeout,
                            ctx.out_dir / f"llamacpp-{qtype}.log")
    levels = {}
    try:
        sinfo = server.wait_ready(300)
        log(f"llama.cpp {qtype} ready after {sinfo['load_s']:.1f} s at {sinfo['address']}")
        for c in a.concurrency:
            llamacpp_load(sinfo["address"], [ctx.warmup_ids], c, c, WARMUP_TOKENS, a.duration)
            log(f"{LABELS['llamacpp-' + qtype.lower()]}: {c} stream(s)")
            raw, t0, t_end = llamacpp_load(sinfo["address"], ctx.prompt_ids, c, c * a.requests_per_stream,
                                           a.max_tokens, a.duration)
            raw.sort(key=lambda x: x[0])
            recs = [make_record(i, r["sent"], r["times"], r["tokens"], r["final"], r["error"], r["cut"]) for i, r in raw]
            levels[c] = {**summarize(recs, t0, t_end), "token_ids": [r["ids"] for _, r in raw]}
            print_level_progress("llamacpp-" + qtype.lower(), c, levels[c])
    finally:
        server.stop()
    return {"levels": levels, "tensor_bytes": info["tensor_bytes"],
            "info": f"xllamacpp {sinfo['xllamacpp']} server, {max(a.concurrency)} slots x {per_slot} ctx, "
                    f"continuous batching, {Path(info['path']).name}"}


# --------------------------------------------------------------------------- report


def fmt(v, digits=1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def ms(p: dict, key: str) -> str:
    v = (p or {}).get(key)
    return "-" if v is None else f"{v * 1000:.0f}"


def ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def print_level_progress(system: str, c: int, s: dict) -> None:
    log(f"{LABELS[system]} @ {c}: decode {fmt(s.get('decode_tokens_per_s'))} tok/s, "
        f"{s['requests_done']}/{s['requests_sent']} done, {s['requests_failed']} failed, "
        f"{s['requests_cut_at_time_cap']} cut, tokens/request p50 {fmt(s['output_tokens_per_request']['p50'], 0)}")


def decode(results: dict, system: str, c: int):
    return ((results.get(system) or {}).get("levels") or {}).get(c, {}).get("decode_tokens_per_s")


def build_report(summary: dict) -> tuple[str, str]:
    """(plain-text tables for stdout, Markdown for docs/benchmarks/results.md)."""
    h, bw, res = summary["host"], summary["bandwidth"], summary["results"]
    conc = summary["concurrency"]
    lim = summary["limit_per_seq"]
    systems = [s for s in SYSTEMS if s in res and res[s].get("levels")]
    sfx = summary["ours_suffix"]
    label = {s: LABELS[s] + (sfx if s in OURS else "") for s in SYSTEMS}
    lines = [
        f"host: {h['cpu']} ({', '.join(h['isa']) or 'no avx2'}), {h['cores']} cores, {h['threads']} threads "
        f"per system; read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s ({bw['method']})",
        f"model: {summary['model']}, {summary['weight_bytes']['fp32'] / 1e6:.0f} MB fp32 read per decode step -> "
        f"limit {lim['fp32']:.1f} tok/s per sequence"
        + (f" (Q8_0 {summary['weight_bytes']['q8_0'] / 1e6:.0f} MB -> {lim['q8_0']:.1f})" if "q8_0" in lim else "")
        + (f" (wint8 estimate {summary['weight_bytes']['wint8'] / 1e6:.0f} MB -> {lim['wint8']:.1f})" if "wint8" in lim else ""),
        f"workload: greedy, {summary['max_tokens']} tokens per request (EOS ignored), {summary['requests_per_stream']} "
        f"request(s) per stream, prompts {summary['prompt_tokens_min']}-{summary['prompt_tokens_max']} tokens",
        "",
    ]
    for s in systems:
        lines.append(f"{label[s]:<24} {res[s]['info']}")
    for s, note in summary["notes"].items():
        lines.append(f"{label.get(s, s):<24} NOT RUN: {note}")
    lines.append("")
    hdr = (f"{'system':<24} {'streams':>7} {'decode tok/s':>12} {'out tok/s':>9} {'of limit':>8} | "
           f"{'TTFT ms p50':>11} {'p90':>6} {'p99':>6} | {'ITL ms p50':>10} {'p90':>6} {'p99':>6} | {'done':>4} {'cut':>3} {'fail':>4}")
    lines += [hdr, "-" * len(hdr)]
    for s in systems:
        for c in conc:
            lv = res[s]["levels"].get(c)
            if not lv:
                continue
            lines.append(
                f"{label[s]:<24} {c:>7} {fmt(lv.get('decode_tokens_per_s')):>12} {fmt(lv['output_tokens_per_s']):>9} "
                f"{fmt(100 * lv['of_limit'], 0) + '%' if lv.get('of_limit') else '-':>8} | "
                f"{ms(lv['ttft_s'], 'p50'):>11} {ms(lv['ttft_s'], 'p90'):>6} {ms(lv['ttft_s'], 'p99'):>6} | "
                f"{ms(lv['itl_s'], 'p50'):>10} {ms(lv['itl_s'], 'p90'):>6} {ms(lv['itl_s'], 'p99'):>6} | "
                f"{lv['requests_done']:>4} {lv['requests_cut_at_time_cap']:>3} {lv['requests_failed']:>4}")
    peers = [s for s in systems if s not in OURS]
    ours = [s for s in systems if s in OURS]
    others = peers + (["offline"] if "offline" in ours and len(ours) > 1 else [])
    if ours and others:
        lines += ["", "ratios of decode tok/s, ours / other (> 1: ours faster)"]
        hdr = f"{'ours':<24} {'streams':>7} " + " ".join(f"{'/ ' + LABELS[p]:>16}" for p in others)
        lines += [hdr, "-" * len(hdr)]
        for o in ours:
            for c in conc:
                cells = [ratio(decode(res, o, c), decode(res, p, c)) if p != o else "-" for p in others]
                lines.append(f"{label[o]:<24} {c:>7} " + " ".join(f"{x:>16}" for x in cells))
    overhead = "openai" in systems and "llm" in systems
    if overhead:
        lines += ["", "OpenAI frontend overhead: decode tok/s of ours OpenAI / ours Triton llm (same text, same server; "
                  "issue 18 asks >= 0.95x)"]
        for c in conc:
            lines.append(f"  {c:>3} stream(s): {fmt(decode(res, 'openai', c))} / {fmt(decode(res, 'llm', c))} = "
                         f"{ratio(decode(res, 'openai', c), decode(res, 'llm', c))}")
    for line in summary.get("agreement", []):
        lines.append(line)
    lines.append("")
    lines.append("decode tok/s: tokens after each request's first / time in which some request was decoding; out tok/s: "
                 "all tokens / wall time; of limit: decode tok/s / (streams x limit per sequence); TTFT / ITL: per "
                 "request and token, client side (offline: engine step ends; HF: its step clock)")

    # Markdown
    md = [f"Host: {h['cpu']} ({', '.join(h['isa']) or 'no AVX2'}), {h['threads']} threads per system "
          f"({h['cores']} cores); read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s measured in the same run "
          f"-> {lim['fp32']:.1f} tok/s per sequence for {summary['weight_bytes']['fp32'] / 1e6:.0f} MB of fp32 "
          f"weights. {summary['model']}, greedy, {summary['max_tokens']} tokens per request with EOS ignored, "
          f"aggregate decode tokens/s (`benchmarks/compare.py`, {summary['date']}).", ""]
    cols = systems
    md.append("| streams | " + " | ".join(label[s] for s in cols) + " | "
              + " | ".join(f"{label[o]} / {LABELS[p]}" for o in ours[:1] for p in peers)
              + (" | " if ours[:1] and peers else "")
              + " | ".join(f"{label[o]} / {label['offline']}" for o in ours if o != "offline" and "offline" in ours)
              + (" | " if len(ours) > 1 and "offline" in ours else "")
              + (f"{label['openai']} / {label['llm']} | " if overhead else "")
              + (f"{label[ours[0]]} of the limit |" if ours else ""))
    ncols = md[-1].count("|") - 1
    md.append("|" + "---|" * ncols)
    for c in conc:
        row = [str(c)] + [fmt(decode(res, s, c)) for s in cols]
        row += [ratio(decode(res, ours[0], c), decode(res, p, c)) for o in ours[:1] for p in peers]
        row += [ratio(decode(res, o, c), decode(res, "offline", c)) for o in ours if o != "offline" and "offline" in ours]
        if overhead:
            row.append(ratio(decode(res, "openai", c), decode(res, "llm", c)))
        if ours:
            ol = res[ours[0]]["levels"].get(c, {}).get("of_limit")
            row.append(f"{100 * ol:.0f}%" if ol else "-")
        md.append("| " + " | ".join(row) + " |")
    md += ["", "| system | streams | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms |", "|---|---|---|---|"]
    for s in systems:
        for c in conc:
            lv = res[s]["levels"].get(c)
            if lv:
                md.append(f"| {label[s]} | {c} | {ms(lv['ttft_s'], 'p50')} / {ms(lv['ttft_s'], 'p90')} / "
                          f"{ms(lv['ttft_s'], 'p99')} | {ms(lv['itl_s'], 'p50')} / {ms(lv['itl_s'], 'p90')} / "
                          f"{ms(lv['itl_s'], 'p99')} |")
    return "\n".join(lines), "\n".join(md) + "\n"


def agreement_lines(res: dict, conc: list[int], eos: list[int]) -> list[str]:
    be = bench_engine()
    out = []
    base = (res.get("offline") or {}).get("levels") or {}
    for peer in ("hf", "llamacpp-f32", "llamacpp-q8_0"):
        lv = (res.get(peer) or {}).get("levels") or {}
        for c in conc[:1]:
            if c in base and c in lv and base[c].get("token_ids") and lv[c].get("token_ids"):
                n = min(len(base[c]["token_ids"]), len(lv[c]["token_ids"]))
                note = (" (llama.cpp's ignore_eos masks EOS: its tokens part from ours at our first EOS)"
                        if peer.startswith("llamacpp") else "")
                out.append(f"greedy tokens, ours offline vs {LABELS[peer]} at {c} stream(s): "
                           f"{be.agreement(base[c]['token_ids'][:n], lv[c]['token_ids'][:n], eos)}{note}")
    return out


# --------------------------------------------------------------------------- main


def parse_list(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"positive integers expected, got {text!r}")
    return sorted(set(out))


class Ctx:
    pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="16 tokens, 1 and 2 streams, 60 s cap: a check, not a measurement")
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--concurrency", type=parse_list, default=None, help="stream counts (default 1,8,32)")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens per request (default 128)")
    ap.add_argument("--requests-per-stream", type=int, default=1)
    ap.add_argument("--context-tokens", type=int, default=0,
                    help="long-context workload: every prompt a passage of about this many tokens, then the "
                         "question (TTFT = its prefill; decode runs at that context); 0: the plain questions")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of every system")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--quantization", default=None, help="EngineConfig.quantization for ours (e.g. wint8)")
    ap.add_argument("--engine-kwargs", default="{}", help="JSON object of EngineConfig fields for ours")
    ap.add_argument("--serving-params", default="{}",
                    help='JSON object of `llm` serving parameters (Triton systems only), e.g. {"stream_interval": 4}')
    ap.add_argument("--duration", type=float, default=None, help="time cap per level, seconds (default 900)")
    ap.add_argument("--ref-python", default=None, help="interpreter with torch + transformers (default build/ref-venv)")
    ap.add_argument("--bandwidth-gib", type=float, default=1.0)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "build" / "bench")
    args = ap.parse_args(argv)

    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.load(sys.stdin))))
        return 0

    args.concurrency = args.concurrency or ([1, 2] if args.quick else [1, 8, 32])
    args.max_tokens = args.max_tokens or (16 if args.quick else 128)
    args.duration = args.duration or (60.0 if args.quick else 900.0)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown systems {bad}; choose from {', '.join(SYSTEMS)}")
    if args.max_tokens < 2 or args.requests_per_stream < 1 or args.threads < 1:
        ap.error("--max-tokens must be >= 2, --requests-per-stream and --threads >= 1")
    try:
        extra = json.loads(args.engine_kwargs)
        assert isinstance(extra, dict)
    except (ValueError, AssertionError):
        ap.error("--engine-kwargs must be a JSON object")
    try:
        serving = json.loads(args.serving_params)
        assert isinstance(serving, dict)
    except (ValueError, AssertionError):
        ap.error("--serving-params must be a JSON object")
    from paddle_llm_triton.config_params import SERVING_KEYS

    if set(serving) - SERVING_KEYS:
        ap.error(f"--serving-params: unknown {sorted(set(serving) - SERVING_KEYS)}; known: {sorted(SERVING_KEYS)}")
    if args.quantization:
        extra["quantization"] = args.quantization
    if {"num_threads", "model_dir"} & set(extra):
        ap.error("--engine-kwargs cannot set num_threads (use --threads: every system gets the same) or model_dir")
    if not (args.model_dir / "config.json").is_file():
        print(f"error: {args.model_dir} has no config.json (run scripts/setup.sh)", file=sys.stderr)
        return 1
    args.model_dir = args.model_dir.resolve()
    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()

    ctx = Ctx()
    ctx.args, ctx.out_dir = args, out_dir
    ctx.questions = bench_engine().QUESTIONS
    ctx.child_timeout = 600 + len(args.concurrency) * (args.duration + 120) * args.requests_per_stream

    log("tokenizing the prompts (and reading EngineConfig's fields)")
    prep = run_worker(sys.executable, "prepare", {"model_dir": str(args.model_dir), "questions": ctx.questions,
                                                  "context_tokens": args.context_tokens}, args.threads, 600, out_dir)
    ctx.questions = prep["questions"]
    unknown = sorted(set(extra) - set(prep["engine_fields"]))
    if unknown:
        hint = (": weight-only int8 is not built in this tree yet, so --quantization cannot be measured"
                if "quantization" in unknown else "")
        print(f"error: EngineConfig has no field {', '.join(unknown)}{hint} (its fields: "
              f"{', '.join(prep['engine_fields'])})", file=sys.stderr)
        return 2
    if prep["chatml_mismatch"]:
        log(f"warning: the ChatML text sent to `llm` tokenizes differently from the chat template for "
            f"questions {prep['chatml_mismatch']}")
    ctx.prompt_ids, ctx.warmup_ids = prep["prompt_ids"], prep["warmup_ids"]
    ctx.pad_token_id = int(prep["pad_token_id"])
    ctx.engine_kwargs = {"num_threads": args.threads, "max_num_seqs": max(32, max(args.concurrency)),
                         "max_num_batched_tokens": max(2048, sum(len(p) for p in ctx.prompt_ids)), **extra}
    ctx.serving_params = serving

    host = host_info(args.threads)
    log(f"host {host['cpu']} ({', '.join(host['isa'])}); measuring read bandwidth")
    bw = measure_bandwidth(args.threads, args.bandwidth_gib, 3 if args.quick else 5)
    cfg = json.loads((args.model_dir / "config.json").read_text())
    tied = bool(cfg.get("tie_word_embeddings", False))
    weight_bytes = {"fp32": 4 * bench_engine().parameter_count(args.model_dir, tied)}
    if args.quantization == "wint8":
        weight_bytes["wint8"] = wint8_bytes_estimate(args.model_dir, tied)
    log(f"read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s")

    results, notes = {}, {}

    def attempt(name, fn):
        t0 = time.monotonic()
        log(f"--- {LABELS[name]}")
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - one system failing must not lose the others' numbers
            for n in (triton_models if name in triton_models else [name]):
                notes[n] = f"{type(e).__name__}: {e}"
            log(f"{LABELS[name]} failed: {notes[name]}")
            return
        for key, val in (out.items() if name in TRITON and "levels" not in out else [(name, out)]):
            val["seconds"] = time.monotonic() - t0
            results[key] = val

    triton_models = [m for m in TRITON if m in systems]
    if "offline" in systems:
        attempt("offline", lambda: run_offline(ctx))
    if triton_models:
        attempt(triton_models[0], lambda: run_triton(ctx, triton_models))
    if "hf" in systems:
        attempt("hf", lambda: run_hf(ctx))
    for q in ("F32", "Q8_0"):
        if f"llamacpp-{q.lower()}" in systems:
            attempt(f"llamacpp-{q.lower()}", lambda q=q: run_llamacpp(ctx, q))
    if "llamacpp-q8_0" in results:
        weight_bytes["q8_0"] = results["llamacpp-q8_0"]["tensor_bytes"]

    limit = {k: bw["bytes_per_s"] / v for k, v in weight_bytes.items()}
    for s, r in results.items():
        key = "q8_0" if s == "llamacpp-q8_0" else ("wint8" if s in OURS and "wint8" in limit else "fp32")
        for c, lv in r["levels"].items():
            d = lv.get("decode_tokens_per_s")
            lv["limit_tokens_per_s"] = c * limit[key]
            lv["of_limit"] = d / (c * limit[key]) if d else None

    summary = {
        "date": time.strftime("%Y-%m-%d"), "host": host, "bandwidth": bw, "model": args.model_dir.name,
        "weight_bytes": weight_bytes, "limit_per_seq": limit, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "requests_per_stream": args.requests_per_stream,
        "engine_kwargs": ctx.engine_kwargs, "serving_params": ctx.serving_params, "ours_suffix": f" ({args.quantization})" if args.quantization else "",
        "prompt_tokens_min": min(len(p) for p in ctx.prompt_ids[:max(args.concurrency)]),
        "prompt_tokens_max": max(len(p) for p in ctx.prompt_ids[:max(args.concurrency)]),
        "results": results, "notes": notes, "seconds": None,
    }
    summary["agreement"] = agreement_lines(results, args.concurrency, prep["eos_token_ids"])
    summary["seconds"] = time.monotonic() - t_start
    text, md = build_report(summary)

    series = {LABELS[s] + (summary["ours_suffix"] if s in OURS else ""):
              [(c, lv["decode_tokens_per_s"]) for c, lv in sorted(r["levels"].items()) if lv.get("decode_tokens_per_s")]
              for s, r in results.items()}
    series[f"read-bandwidth limit (fp32, {bw['bytes_per_s'] / 1e9:.0f} GB/s)"] = [(c, c * limit["fp32"])
                                                                                 for c in args.concurrency]
    plot_spec = {"series": series, "path": str(out_dir / "compare.png"),
                 "title": f"{args.model_dir.name}, {args.max_tokens} tokens, {args.threads} threads, {host['cpu']}"}
    try:
        if importlib.util.find_spec("matplotlib") is not None:
            worker_plot(plot_spec)
        else:
            run_worker(ensure_peer_venv(PEER_PINS + PLOT_PINS), "plot", plot_spec, args.threads, 600, out_dir)
    except Exception as e:  # noqa: BLE001 - the tables matter more than the picture
        notes["plot"] = f"{type(e).__name__}: {e}"
        log(f"plot failed: {notes['plot']}")
        text += f"\nplot not written: {notes['plot']}"

    for s in results.values():  # token ids are for the agreement lines only
        for lv in s["levels"].values():
            lv.pop("token_ids", None)
    (out_dir / "compare.md").write_text(md)
    (out_dir / "compare.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(text)
    timed = {("+".join(triton_models) if s in triton_models and len(triton_models) > 1 else s): r["seconds"]
             for s, r in results.items() if "seconds" in r}
    per_system = ", ".join(f"{s} {sec:.0f} s" for s, sec in timed.items())
    print(f"\nwritten: {out_dir / 'compare.md'}, {out_dir / 'compare.png'}, {out_dir / 'compare.json'}; "
          f"whole run {summary['seconds']:.0f} s ({per_system})")
    return 0 if not notes else 1


if __name__ == "__main__":
    sys.exit(main())
