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
import queue
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

PROMPTS = [
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
]

_DTYPES = {np.object_: "BYTES", np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL", np.uint64: "UINT64"}


def chatml(question: str, system: str = SYSTEM_PROMPT) -> str:
    """The SmolLM2-Instruct chat template (ChatML) for one user turn plus the assistant prompt."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def _tensor(name: str, arr: np.ndarray) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(arr.shape), _DTYPES[arr.dtype.type])
    t.set_data_from_numpy(arr)
    return t


def build_inputs(model: str, question: str, args) -> list:
    if model == "ensemble":  # one row: every input is [1, 1] (batch dimension first)
        def scalar(name, value, dtype):
            return _tensor(name, np.array([[value]], dtype=dtype))
        inputs = [scalar("text_input", question.encode("utf-8"), np.object_),
                  scalar("max_tokens", args.max_tokens, np.int32),
                  scalar("stream", True, np.bool_),
                  scalar("apply_chat_template", True, np.bool_),
                  scalar("temperature", args.temperature, np.float32)]
        if args.temperature > 0:  # TensorRT-LLM semantics: without top_k / top_p decoding is greedy
            inputs.append(scalar("top_p", args.top_p, np.float32))
        if args.seed is not None:
            inputs.append(scalar("seed", args.seed, np.uint64))
        if getattr(args, "min_tokens", 0):
            inputs.append(scalar("min_tokens", args.min_tokens, np.int32))
        return inputs
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "ignore_eos": bool(args.ignore_eos)}
    if getattr(args, "min_tokens", 0):
        sampling["min_tokens"] = args.min_tokens
    if args.seed is not None:
        sampling["seed"] = args.seed

    def vec(name, value, dtype):  # max_batch_size 0: every input is [1]
        return _tensor(name, np.array([value], dtype=dtype))
    return [vec("text_input", chatml(question).encode("utf-8"), np.object_),
            vec("stream", True, np.bool_),
            vec("sampling_parameters", json.dumps(sampling).encode("utf-8"), np.object_),
            vec("return_num_output_tokens", True, np.bool_),
            vec("return_num_input_tokens", True, np.bool_),
            vec("return_finish_reason", True, np.bool_)]


class RequestRecord:
    __slots__ = ("index", "sent", "times", "tokens", "final", "error", "cut", "finish_reason",
                 "prompt_tokens", "text_len")

    def __init__(self, index: int):
        self.index = index
        self.sent = 0.0
        self.times: list[float] = []   # arrival time of each response that carries tokens
        self.tokens: list[int] = []    # tokens in that response
        self.final: float | None = None
        self.error: str | None = None
        self.cut = False
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.text_len = 0


def _first(arr):
    return None if arr is None or arr.size == 0 else arr.reshape(-1)[0]


def count_tokens(model: str, result) -> tuple[int, str]:
    """(tokens in this response, method)."""
    if model == "llm":
        n = _first(result.as_numpy("num_output_tokens"))
        if n is not None:
            return int(n), "num_output_tokens"
    else:
        lps = result.as_numpy("output_log_probs")
        if lps is not None and lps.size > 0:
            return int(lps.size), "output_log_probs length"
    text = _first(result.as_numpy("text_output"))
    return (1 if text else 0), "responses with text"


class Worker(threading.Thread):
    """One gRPC client and stream; sends its requests one after another."""

    def __init__(self, args, next_index, deadline: float, records: list, methods: set):
        super().__init__(daemon=True)
        self.args, self.next_index, self.deadline = args, next_index, deadline
        self.records, self.methods = records, methods
        self.q: queue.Queue = queue.Queue()
        self.client = None
        self.prompts = getattr(args, "prompts", None) or PROMPTS

    def _open(self):
        self.client = grpcclient.InferenceServerClient(self.args.url)
        self.client.start_stream(callback=lambda result, error: self.q.put((time.perf_counter(), result, error)))

    def _close(self, cancel: bool):
        if self.client is not None:
            try:
                self.client.stop_stream(cancel_requests=cancel)
                self.client.close()
            except Exception:  # noqa: BLE001 - closing a broken stream
                pass
            self.client = None

    def run(self):
        try:
            self._open()
        except Exception as e:  # noqa: BLE001 - server unreachable: fail this worker's first request
            i = self.next_index()
            if i is not None:
                rec = RequestRecord(i)
                rec.error = f"connect: {e}"
                self.records.append(rec)
            return
        try:
            while time.perf_counter() < self.deadline:
                i = self.next_index()
                if i is None:
                    break
                rec = RequestRecord(i)
                self.records.append(rec)
                if not self._one(rec):  # stream unusable (cut at the time cap, or broken): reopen
                    self._close(cancel=True)
                    if rec.cut:
                        break
                    self._open()
        finally:
            self._close(cancel=False)

    def _one(self, rec: RequestRecord) -> bool:
        args = self.args
        question = self.prompts[rec.index % len(self.prompts)]
        rid = f"load-{rec.index}"
        inputs = build_inputs(args.model, question, args)
        rec.sent = time.perf_counter()
        try:
            self.client.async_stream_infer(args.model, inputs, request_id=rid, enable_empty_final_response=True)
        except Exception as e:  # noqa: BLE001 - the stream's own error, if any, came through the callback
            try:
                _, _, detail = self.q.get(timeout=1.0)
            except queue.Empty:
                detail = None
            rec.error = f"send: {detail or e}"
            return False
        while True:
            limit = min(self.deadline, rec.sent + args.timeout) - time.perf_counter()
            try:
                t, result, error = self.q.get(timeout=max(limit, 0.0))
            except queue.Empty:
                if time.perf_counter() >= self.deadline:
                    rec.cut = True
                else:
                    rec.error = f"timeout after {args.timeout:.0f} s"
                return False
            if error is not None:
                rec.error = str(error)
                return True  # the request is over; the stream stays usable
            if result.get_response().id not in ("", rid):
                continue  # a late response of an earlier request on this stream
            if result.get_response().outputs:
                n, method = count_tokens(args.model, result)
                self.methods.add(method)
                text = _first(result.as_numpy("text_output"))
                rec.text_len += len(text) if text else 0
                if n > 0:
                    rec.times.append(t)
                    rec.tokens.append(n)
                if args.model == "llm":
                    reason = _first(result.as_numpy("finish_reason"))
                    if reason:
                        rec.finish_reason = reason.decode() if isinstance(reason, bytes) else str(reason)
                    pt = _first(result.as_numpy("num_input_tokens"))
                    if pt is not None:
                        rec.prompt_tokens = int(pt)
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                rec.final = t
                return True


def percentiles(values, ps=(50, 90, 99)) -> dict:
    if not values:
        return {"count": 0, "mean": None, **{f"p{p}": None for p in ps}}
    a = np.asarray(values, dtype=np.float64)
    return {"count": int(a.size), "mean": float(a.mean()), **{f"p{p}": float(np.percentile(a, p)) for p in ps}}


def run_load(args) -> dict:
    """Run the load described by args; return the summary dict."""
    counter = {"next": 0}
    lock = threading.Lock()

    def next_index():
        with lock:
            if counter["next"] >= args.requests:
                return None
            counter["next"] += 1
            return counter["next"] - 1

    if args.warmup:
        warm = argparse.Namespace(**{**vars(args), "requests": args.warmup})
        w_counter = iter(range(args.warmup))
        w_records: list = []
        w = Worker(warm, lambda: next(w_counter, None), time.perf_counter() + args.timeout, w_records, set())
        w.start()
        w.join()

    records: list[RequestRecord] = []
    methods: set = set()
    t0 = time.perf_counter()
    deadline = t0 + args.duration
    workers = [Worker(args, next_index, deadline, records, methods) for _ in range(args.concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    t_end = time.perf_counter()
    return {
        "model": args.model,
        "url": args.url,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "ignore_eos": bool(args.ignore_eos) and args.model == "llm",
        "min_tokens": getattr(args, "min_tokens", 0),
        "temperature": args.temperature,
        "requests_planned": args.requests,
        "time_cap_s": args.duration,
        "token_count_method": ", ".join(sorted(methods)) or None,
        **summarize_records(records, t0, t_end, prompt_tokens=args.model == "llm"),
    }


def decode_window(records) -> float:
    """Seconds during which at least one request was between its first and its last token response
    (the union of the [first, last] intervals)."""
    spans = sorted((r.times[0], r.times[-1]) for r in records if len(r.times) > 1)
    total, cur_start, cur_end = 0.0, None, None
    for a, b in spans:
        if cur_end is None or a > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def summarize_records(records, t0: float, t_end: float, prompt_tokens: bool = True) -> dict:
    """Throughput and latency statistics of finished load records (RequestRecord-like objects with
    sent, times, tokens, final, error, cut); t0: when the first request could be sent. Also used by
    benchmarks/compare.py for systems it drives itself, so every system is measured the same way."""
    done = [r for r in records if r.error is None and not r.cut and r.final is not None]
    failed = [r for r in records if r.error is not None]
    cut = [r for r in records if r.cut]
    # Wall time: first send to the last event of any request (a completion, or the last tokens of a
    # request cut at the time cap), so that every counted token lies inside it.
    last = max([r.final or (r.times[-1] if r.times else r.sent) for r in records] or [t_end])
    wall = max(last - t0, 1e-9)
    total_tokens = sum(sum(r.tokens) for r in records)
    done_tokens = sum(sum(r.tokens) for r in done)

    ttft, itl, e2e, decode_rate = [], [], [], []
    for r in done:
        e2e.append(r.final - r.sent)
        if not r.times:
            continue
        ttft.append(r.times[0] - r.sent)
        for k in range(1, len(r.times)):
            per_token = (r.times[k] - r.times[k - 1]) / r.tokens[k]
            itl.extend([per_token] * r.tokens[k])
        span = r.times[-1] - r.times[0]
        if len(r.times) > 1 and span > 0:
            decode_rate.append(sum(r.tokens[1:]) / span)

    reasons: dict = {}
    for r in done:
        if r.finish_reason:
            reasons[r.finish_reason] = reasons.get(r.finish_reason, 0) + 1
    out_per_req = [sum(r.tokens) for r in done]
    window = decode_window(records)
    decode_tokens = sum(sum(r.tokens[1:]) for r in records if len(r.times) > 1)
    return {
        "requests_sent": len(records),
        "requests_done": len(done),
        "requests_failed": len(failed),
        "requests_cut_at_time_cap": len(cut),
        "total_output_tokens": total_tokens,
        "output_tokens_of_done_requests": done_tokens,
        "total_prompt_tokens": sum(r.prompt_tokens or 0 for r in done) if prompt_tokens else None,
        "output_tokens_per_request": percentiles(out_per_req),
        "wall_time_s": wall,
        "output_tokens_per_s": total_tokens / wall,
        "requests_per_s": len(done) / wall,
        "decode_window_s": window,
        "decode_tokens_per_s": decode_tokens / window if window > 0 else None,
        "decode_tokens_per_s_per_request": percentiles(decode_rate),
        "ttft_s": percentiles(ttft),
        "itl_s": percentiles(itl),
        "e2e_latency_s": percentiles(e2e),
        "finish_reasons": reasons or None,
        "errors": [f"request {r.index}: {r.error}" for r in failed[:5]],
    }


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
