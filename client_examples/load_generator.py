"""Load generator: N concurrent gRPC streams against `ensemble` or `llm`, reporting throughput, TTFT,
inter-token latency and end-to-end latency. Stops by itself.

    .venv/bin/python client_examples/load_generator.py [--url 127.0.0.1:8001] [--model ensemble|llm]
        [--concurrency 8] [--requests 32] [--duration 300] [--max-tokens 64] [--ignore-eos]
        [--min-tokens N] [--prompts-file questions.json] [--json]

    e.g. .venv/bin/python client_examples/load_generator.py --model llm --ignore-eos --concurrency 8 --requests 32

What it does: `--concurrency` worker threads, each with its own gRPC client and bidirectional stream,
send one streamed request at a time until `--requests` requests have been sent in total, or until
`--duration` seconds have passed (the time cap: nothing new is sent after it, and requests still
running then are cancelled with stop_stream(cancel_requests=True) and reported as "cut", not failed).
Prompts cycle through a built-in list of varied questions (or the JSON list of strings in
--prompts-file), always in chat form: `ensemble` gets
apply_chat_template=true (the server applies the model's template); `llm` takes text as is (Triton
vLLM-backend contract), so this client wraps each question in the SmolLM2 / ChatML template itself.
Decoding is greedy by default (--temperature) with a fixed --max-tokens.

Stopping and token counts:
- `llm`: sampling_parameters {"max_tokens": M, "temperature": T, "ignore_eos": true|false}; every
  streamed response carries num_output_tokens (return_num_output_tokens=true: the tokens in that
  response), so counts are exact, and finish_reason is tallied. With --ignore-eos every request makes
  exactly M tokens.
- `ensemble`: the TensorRT-LLM names have no ignore_eos, so --ignore-eos does not apply (a note is
  printed); requests stop at EOS or max_tokens. Tokens per response = the length of output_log_probs
  (one entry per generated token, TensorRT-LLM style); a response without it counts as 1 token if it
  carries text. The count used is reported as token_count_method.
- `--min-tokens N` (both models: sampling_parameters min_tokens / the min_tokens tensor) masks EOS
  until N tokens exist; with N = --max-tokens every request makes exactly max-tokens tokens on
  `ensemble` too (the fixed-length load benchmarks/compare.py uses).

Metrics (client side, seconds):
- TTFT: send -> first response with at least one token.
- ITL: for each later response, (time since the previous response) / (tokens in it), one sample per
  token; reported as p50 / p90 / p99 over all tokens of all requests.
- per-request decode tokens/s: (tokens after the first response) / (last response - first response).
- aggregate decode tokens/s: tokens after each request's first response / the time during which at
  least one request was between its first and its last response (the union of those intervals).
- e2e latency: send -> final response. Aggregate output tokens/s = all output tokens / wall time
  (first send to last completion). Only completed requests enter the latency statistics.
--json prints one JSON object (the same numbers, machine-readable) instead of the table.
"""

from __future__ import annotations

import argparse
import json
import sys

from load_client import run_load  # noqa: I001 (this folder, run as a script)


def _ms(v):
    return "-" if v is None else f"{v * 1000:.1f}"


def _num(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def print_report(s: dict) -> None:
    print(f"model {s['model']} at {s['url']}: concurrency {s['concurrency']}, max_tokens {s['max_tokens']}, "
          f"ignore_eos {s['ignore_eos']}, temperature {s['temperature']}")
    print(f"requests      done {s['requests_done']} / sent {s['requests_sent']} (planned {s['requests_planned']}), "
          f"failed {s['requests_failed']}, cut at the {s['time_cap_s']:g} s cap {s['requests_cut_at_time_cap']}")
    if s["finish_reasons"]:
        print(f"finish        {', '.join(f'{k} {v}' for k, v in sorted(s['finish_reasons'].items()))}")
    opr = s["output_tokens_per_request"]
    print(f"tokens        {s['total_output_tokens']} output tokens (counted by {s['token_count_method']}); "
          f"per request mean {_num(opr['mean'])}, p50 {_num(opr['p50'])}"
          + (f"; {s['total_prompt_tokens']} prompt tokens" if s["total_prompt_tokens"] is not None else ""))
    print(f"wall time     {s['wall_time_s']:.2f} s")
    print(f"throughput    {s['output_tokens_per_s']:.1f} output tokens/s aggregate, {s['requests_per_s']:.2f} requests/s")
    d = s["decode_tokens_per_s_per_request"]
    print(f"decode/req    mean {_num(d['mean'])} tokens/s, p50 {_num(d['p50'])}, p90 {_num(d['p90'])}")
    print(f"{'latency (ms)':<14}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}{'samples':>9}")
    for label, key in (("TTFT", "ttft_s"), ("ITL / token", "itl_s"), ("e2e", "e2e_latency_s")):
        p = s[key]
        print(f"{label:<14}{_ms(p['p50']):>9}{_ms(p['p90']):>9}{_ms(p['p99']):>9}{_ms(p['mean']):>9}{p['count']:>9}")
    for e in s["errors"]:
        print(f"error: {e}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="127.0.0.1:8001", help="gRPC endpoint host:port")
    ap.add_argument("--model", choices=("ensemble", "llm"), default="ensemble")
    ap.add_argument("--concurrency", "-c", type=int, default=8, help="concurrent streams")
    ap.add_argument("--requests", "-n", type=int, default=32, help="requests to send in total")
    ap.add_argument("--duration", type=float, default=300.0,
                    help="time cap in seconds: no new requests after it, running ones are cancelled")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ignore-eos", action="store_true", help="llm only: generate exactly max_tokens")
    ap.add_argument("--min-tokens", type=int, default=0,
                    help="mask EOS until this many tokens exist (both models; = --max-tokens: fixed length)")
    ap.add_argument("--prompts-file", default=None, help="JSON list of questions to cycle through instead of the built-in ones")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=0, help="requests sent (one at a time) before measuring")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    ap.add_argument("--json", action="store_true", help="print a JSON summary instead of the table")
    args = ap.parse_args(argv)
    if args.concurrency < 1 or args.requests < 1 or args.max_tokens < 1:
        ap.error("--concurrency, --requests and --max-tokens must be >= 1")
    if not 0 <= args.min_tokens <= args.max_tokens:
        ap.error("--min-tokens must be in [0, --max-tokens]")
    args.prompts = None
    if args.prompts_file:
        with open(args.prompts_file) as f:
            args.prompts = json.load(f)
        if not args.prompts or not all(isinstance(q, str) and q for q in args.prompts):
            ap.error("--prompts-file must hold a non-empty JSON list of non-empty strings")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.ignore_eos and args.model == "ensemble":
        print("note: --ignore-eos applies to --model llm only (the TensorRT-LLM inputs have no such flag); "
              "ensemble requests stop at EOS or max_tokens and the actual token counts are reported",
              file=sys.stderr)
    summary = run_load(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_report(summary)
    return 0 if summary["requests_failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
