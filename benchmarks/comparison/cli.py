"""The command of benchmarks/compare.py: its options, the checks before anything runs, the run (the
prompts tokenized in a worker, the host measured, then each system in turn; one failing system is
noted and the rest still run) and the outputs (tables on stdout, compare.md / .png / .json)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

from comparison.common import LABELS, OURS, PEER_PINS, PLOT_PINS, REPO_ROOT, SYSTEMS, TRITON, bench_engine, log
from comparison.measure import apply_limits, host_info, measure_bandwidth, wint4_bytes_estimate, wint8_bytes_estimate
from comparison.ours import run_offline, run_triton
from comparison.competitor import Competitor, last_cpu
from comparison.peers import ensure_peer_venv, run_hf, run_llamacpp
from comparison.report import agreement_lines, build_report
from comparison.workers import WORKERS, run_worker, worker_plot


def parse_list(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"positive integers expected, got {text!r}")
    return sorted(set(out))


class Ctx:
    pass


def build_parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
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
    ap.add_argument("--competitor", action="store_true",
                    help="run every system beside a busy loop pinned to the last CPU (after the bandwidth probe)")
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "build" / "bench")
    return ap


def check_args(ap: argparse.ArgumentParser, args) -> tuple[list[str], dict, dict]:
    """Defaults that depend on --quick, and every check that needs no child process: (systems, the
    EngineConfig kwargs of ours, the `llm` serving parameters). ap.error exits on a bad option."""
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
    return systems, extra, serving


def prepare(args, out_dir: Path, extra: dict, serving: dict) -> Ctx | None:
    """Tokenize the prompts in a worker (and read EngineConfig's fields: an unknown engine setting is an
    error here, None); the run's context for the systems."""
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
        return None
    if prep["chatml_mismatch"]:
        log(f"warning: the ChatML text sent to `llm` tokenizes differently from the chat template for "
            f"questions {prep['chatml_mismatch']}")
    ctx.prompt_ids, ctx.warmup_ids = prep["prompt_ids"], prep["warmup_ids"]
    ctx.pad_token_id = int(prep["pad_token_id"])
    ctx.eos_token_ids = prep["eos_token_ids"]
    ctx.engine_kwargs = {"num_threads": args.threads, "max_num_seqs": max(32, max(args.concurrency)),
                         "max_num_batched_tokens": max(2048, sum(len(p) for p in ctx.prompt_ids)), **extra}
    ctx.serving_params = serving
    return ctx


def measure_host(args) -> tuple[dict, dict, dict]:
    """(host, read bandwidth, weight bytes read per decode step: fp32, and the wint8 estimate if asked)."""
    host = host_info(args.threads)
    log(f"host {host['cpu']} ({', '.join(host['isa'])}); measuring read bandwidth")
    bw = measure_bandwidth(args.threads, args.bandwidth_gib, 3 if args.quick else 5)
    cfg = json.loads((args.model_dir / "config.json").read_text())
    tied = bool(cfg.get("tie_word_embeddings", False))
    weight_bytes = {"fp32": 4 * bench_engine().parameter_count(args.model_dir, tied)}
    if args.quantization == "wint8":
        weight_bytes["wint8"] = wint8_bytes_estimate(args.model_dir, tied)
    if args.quantization == "wint4":
        weight_bytes["wint4"] = wint4_bytes_estimate(args.model_dir, tied)
    log(f"read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s")
    return host, bw, weight_bytes


def run_systems(ctx, systems: list[str]) -> tuple[dict, dict, list[str]]:
    """Each asked system in turn, never two at once: (results by system, notes of those that failed,
    the Triton systems, which share one server)."""
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
    for q in ("F32", "Q8_0", "Q4_1"):
        if f"llamacpp-{q.lower()}" in systems:
            attempt(f"llamacpp-{q.lower()}", lambda q=q: run_llamacpp(ctx, q))
    return results, notes, triton_models


def make_summary(ctx, host: dict, bw: dict, weight_bytes: dict, limit: dict, results: dict, notes: dict) -> dict:
    """Everything compare.json holds (token ids still in the levels: the agreement lines need them)."""
    args = ctx.args
    summary = {
        "date": time.strftime("%Y-%m-%d"), "host": host, "bandwidth": bw, "model": args.model_dir.name,
        "weight_bytes": weight_bytes, "limit_per_seq": limit, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "requests_per_stream": args.requests_per_stream,
        "engine_kwargs": ctx.engine_kwargs, "serving_params": ctx.serving_params, "ours_suffix": f" ({args.quantization})" if args.quantization else "",
        "prompt_tokens_min": min(len(p) for p in ctx.prompt_ids[:max(args.concurrency)]),
        "prompt_tokens_max": max(len(p) for p in ctx.prompt_ids[:max(args.concurrency)]),
        "results": results, "notes": notes, "seconds": None,
    }
    summary["agreement"] = agreement_lines(results, args.concurrency, ctx.eos_token_ids)
    return summary


def write_plot(summary: dict, args, out_dir: Path) -> str:
    """compare.png (in this process if .venv has matplotlib, else a plot worker in the peer venv); a
    failure is noted in summary["notes"] and returned as a line for the tables, else ""."""
    bw, limit, notes = summary["bandwidth"], summary["limit_per_seq"], summary["notes"]
    series = {LABELS[s] + (summary["ours_suffix"] if s in OURS else ""):
              [(c, lv["decode_tokens_per_s"]) for c, lv in sorted(r["levels"].items()) if lv.get("decode_tokens_per_s")]
              for s, r in summary["results"].items()}
    series[f"read-bandwidth limit (fp32, {bw['bytes_per_s'] / 1e9:.0f} GB/s)"] = [(c, c * limit["fp32"])
                                                                                 for c in args.concurrency]
    plot_spec = {"series": series, "path": str(out_dir / "compare.png"),
                 "title": f"{args.model_dir.name}, {args.max_tokens} tokens, {args.threads} threads, "
                          f"{summary['host']['cpu']}"}
    try:
        if importlib.util.find_spec("matplotlib") is not None:
            worker_plot(plot_spec)
        else:
            run_worker(ensure_peer_venv(PEER_PINS + PLOT_PINS), "plot", plot_spec, args.threads, 600, out_dir)
    except Exception as e:  # noqa: BLE001 - the tables matter more than the picture
        notes["plot"] = f"{type(e).__name__}: {e}"
        log(f"plot failed: {notes['plot']}")
        return f"\nplot not written: {notes['plot']}"
    return ""


def write_outputs(summary: dict, text: str, md: str, out_dir: Path, triton_models: list[str]) -> None:
    """compare.md and compare.json (without token ids), then the tables and what was written."""
    results = summary["results"]
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


def main(argv=None, description: str = "") -> int:
    ap = build_parser(description)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.load(sys.stdin))))
        return 0

    systems, extra, serving = check_args(ap, args)
    if not (args.model_dir / "config.json").is_file():
        print(f"error: {args.model_dir} has no config.json (run scripts/setup.sh)", file=sys.stderr)
        return 1
    args.model_dir = args.model_dir.resolve()
    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()

    ctx = prepare(args, out_dir, extra, serving)
    if ctx is None:
        return 2
    host, bw, weight_bytes = measure_host(args)
    if args.competitor:
        cpu = last_cpu()
        log(f"competitor: a busy loop pinned to CPU {cpu} while every system runs")
        host["competitor"] = f"a Python busy loop at normal priority pinned to CPU {cpu}"
        with Competitor(cpu):
            results, notes, triton_models = run_systems(ctx, systems)
    else:
        results, notes, triton_models = run_systems(ctx, systems)
    for q in ("q8_0", "q4_1"):
        if f"llamacpp-{q}" in results:
            weight_bytes[q] = results[f"llamacpp-{q}"]["tensor_bytes"]
    limit = apply_limits(results, weight_bytes, bw["bytes_per_s"])

    summary = make_summary(ctx, host, bw, weight_bytes, limit, results, notes)
    summary["seconds"] = time.monotonic() - t_start
    text, md = build_report(summary)
    text += write_plot(summary, args, out_dir)
    write_outputs(summary, text, md, out_dir, triton_models)
    return 0 if not notes else 1
