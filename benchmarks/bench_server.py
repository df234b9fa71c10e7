"""Server benchmark: start tritonserver with our model repository, time its start-up, drive it with the
load generator at 1 and 8 concurrent streams, print the results, stop the server. One command:

    .venv/bin/python benchmarks/bench_server.py [--model llm|ensemble] [--concurrency 1,8]
        [--requests-per-stream 4] [--max-tokens 64] [--no-ignore-eos] [--duration 300] [--json]

The server is started through paddle_llm_launcher's start_server on free loopback ports (as
tests/conftest.py does), with model_repository/ and --model-dir (default build/SmolLM2-135M-Instruct);
its output goes to --server-log (default build/bench-logs/tritonserver.log). Start-up time is from
process start until /v2/health/ready answers 200 (engine load included).

Load: for each concurrency level C, `client_examples/load_generator.py --json` runs as a subprocess
(the load logic lives only there) with C streams and C * --requests-per-stream requests, greedy,
--max-tokens tokens each and, for `llm`, ignore_eos (so every request makes exactly max-tokens
tokens; the ensemble has no such input and stops at EOS: see the load generator's doc). The first
level is preceded by --warmup requests that are not measured. After the last level, the server's own
`llm_*` metrics are printed with client_examples/metrics_scrape.py. The server is always stopped
(SIGTERM, then the launcher's watchdog), also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import paddle_llm_launcher as launcher

REPO_ROOT = Path(__file__).resolve().parent.parent
LOAD_GENERATOR = REPO_ROOT / "client_examples" / "load_generator.py"
METRICS_SCRAPE = REPO_ROOT / "client_examples" / "metrics_scrape.py"


def run_level(args, grpc_url: str, concurrency: int, warmup: int) -> dict:
    cmd = [sys.executable, str(LOAD_GENERATOR), "--json", "--url", grpc_url, "--model", args.model,
           "--concurrency", str(concurrency), "--requests", str(concurrency * args.requests_per_stream),
           "--max-tokens", str(args.max_tokens), "--duration", str(args.duration),
           "--warmup", str(warmup), "--temperature", str(args.temperature)]
    if args.ignore_eos and args.model == "llm":
        cmd.append("--ignore-eos")
    print(f"bench_server: {concurrency} stream(s): {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                          timeout=args.duration + 600 + (warmup + 1) * 600)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise RuntimeError(f"load generator exited with {proc.returncode} and no JSON summary:\n{proc.stdout}")


def _ms(p: dict, key: str) -> str:
    v = p.get(key)
    return "-" if v is None else f"{v * 1000:.0f}"


def _f(v, digits=1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_report(s: dict) -> None:
    print(f"tritonserver ready after {s['startup_s']:.2f} s (model {s['model_dir']}); "
          f"model {s['model']}, max_tokens {s['max_tokens']}, ignore_eos {s['ignore_eos']}")
    print()
    hdr = (f"{'streams':>7} {'done':>5} {'fail':>4} {'cut':>3} {'out tok':>7} {'wall s':>7} {'tok/s':>7} "
           f"{'dec/req':>7} | {'TTFT ms p50':>11} {'p90':>6} {'p99':>6} | {'ITL ms p50':>10} {'p90':>5} "
           f"{'p99':>5} | {'e2e s p50':>9} {'p99':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in s["levels"]:
        t, i, e = r["ttft_s"], r["itl_s"], r["e2e_latency_s"]
        print(f"{r['concurrency']:>7} {r['requests_done']:>5} {r['requests_failed']:>4} "
              f"{r['requests_cut_at_time_cap']:>3} {r['total_output_tokens']:>7} {r['wall_time_s']:>7.1f} "
              f"{r['output_tokens_per_s']:>7.1f} {_f(r['decode_tokens_per_s_per_request']['p50']):>7} | "
              f"{_ms(t, 'p50'):>11} {_ms(t, 'p90'):>6} {_ms(t, 'p99'):>6} | {_ms(i, 'p50'):>10} "
              f"{_ms(i, 'p90'):>5} {_ms(i, 'p99'):>5} | {_f(e['p50'], 2):>9} {_f(e['p99'], 2):>6}")
        for err in r.get("errors") or []:
            print(f"        error: {err}")
    base = s["levels"][0]
    for r in s["levels"][1:]:
        if base["output_tokens_per_s"]:
            print(f"\n{r['concurrency']} streams vs {base['concurrency']}: "
                  f"{r['output_tokens_per_s'] / base['output_tokens_per_s']:.2f}x aggregate output tokens/s")
    print("\ntok/s: aggregate output tokens/s; dec/req: per-request decode tokens/s (p50); tokens counted by "
          f"{base.get('token_count_method')}")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("llm", "ensemble"), default="llm")
    ap.add_argument("--model-dir", type=Path, default=REPO_ROOT / "build" / "SmolLM2-135M-Instruct")
    ap.add_argument("--model-repo", type=Path, default=REPO_ROOT / "model_repository")
    ap.add_argument("--concurrency", default="1,8", help="comma-separated stream counts")
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                    help="llm: let requests stop at EOS (default: ignore_eos, fixed token counts)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured requests before the first level")
    ap.add_argument("--duration", type=float, default=300.0, help="time cap per level, seconds")
    ap.add_argument("--ready-timeout", type=float, default=180.0)
    ap.add_argument("--server-log", type=Path, default=REPO_ROOT / "build" / "bench-logs" / "tritonserver.log")
    ap.add_argument("--no-server-metrics", action="store_true", help="skip the llm_* metrics table at the end")
    ap.add_argument("--json", action="store_true", help="print a JSON summary instead of the tables")
    return ap


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if not levels or min(levels) < 1 or args.requests_per_stream < 1:
        ap.error("--concurrency needs positive integers and --requests-per-stream >= 1")
    if not (args.model_dir / "config.json").is_file():
        print(f"error: {args.model_dir} has no config.json (run scripts/setup.sh)", file=sys.stderr)
        return 1

    http_port, grpc_port, metrics_port = launcher.free_ports(3)
    server = launcher.start_server(args.model_repo, http_port, grpc_port, metrics_port,
                                   model_dir=args.model_dir, log_path=args.server_log)
    print(f"bench_server: tritonserver pid {server.pid} on 127.0.0.1 http {http_port} grpc {grpc_port} "
          f"metrics {metrics_port}; log {args.server_log}", file=sys.stderr, flush=True)
    summary = {"model": args.model, "model_dir": str(args.model_dir), "max_tokens": args.max_tokens,
               "ignore_eos": args.ignore_eos and args.model == "llm", "startup_s": None, "levels": []}
    try:
        try:
            summary["startup_s"] = server.wait_ready(timeout=args.ready_timeout)
        except (RuntimeError, TimeoutError) as e:
            print(f"error: {e}\n----- tail of {args.server_log} -----\n{server.log_tail(40)}", file=sys.stderr)
            return 1
        print(f"bench_server: ready after {summary['startup_s']:.2f} s", file=sys.stderr, flush=True)
        for n, c in enumerate(levels):
            summary["levels"].append(run_level(args, server.grpc_url, c, args.warmup if n == 0 else 0))
        metrics_text = None
        if not args.no_server_metrics:
            proc = subprocess.run([sys.executable, str(METRICS_SCRAPE), "--url", f"127.0.0.1:{metrics_port}"],
                                  stdout=subprocess.PIPE, text=True, timeout=60)
            metrics_text = proc.stdout
    except KeyboardInterrupt:
        print("bench_server: interrupted", file=sys.stderr)
        return 130
    finally:
        t0 = time.monotonic()
        code = server.stop()
        print(f"bench_server: tritonserver stopped (exit code {code}, {time.monotonic() - t0:.1f} s"
              f"{', killed by the watchdog' if server.killed else ''})", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_report(summary)
        if metrics_text:
            print("\nserver-side metrics (all levels and warm-up together):")
            print(metrics_text.rstrip())
    return 0 if all(r["requests_failed"] == 0 for r in summary["levels"]) else 1


if __name__ == "__main__":
    sys.exit(main())
