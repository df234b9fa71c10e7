"""The gRPC side of client_examples/load_generator.py: the prompts (chat form), the request inputs
of `ensemble` and `llm`, the token count of each streamed response, the worker threads (one client and
stream each) and run_load, which runs a whole load and returns its summary (load_stats)."""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient

from load_stats import RequestRecord, summarize_records  # noqa: I001 (this folder)

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
