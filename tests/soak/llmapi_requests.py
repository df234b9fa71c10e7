"""Requests to `tensorrt_llm` (TensorRT-LLM's llmapi contract) as its own clients send them: unary
ModelInfer (tritonclient `infer`), and the stop signal under the request id of a long request in
flight (both answers must be CANCELLED). Each records an Outcome like the other kinds."""

from __future__ import annotations

import queue
import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from records import Outcome

MODEL = "tensorrt_llm"
PROMPTS = ("The current time is", "Name three rivers.", "Born in north-east France, Soyer trained as a")
COUNT = "Count from 1 to 1000, separated by commas: 1, 2, 3, 4, 5,"  # greedy: hundreds of tokens


def _t(name: str, arr: np.ndarray):
    t = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
    t.set_data_from_numpy(arr)
    return t


def _inputs(text: str, max_tokens: int) -> list:
    return [_t("text_input", np.array([text], dtype=object)),
            _t("sampling_param_max_tokens", np.array([max_tokens], dtype=np.int32)),
            _t("return_finish_reason", np.array([True]))]


def _client(ctx, out: Outcome):
    try:
        return grpcclient.InferenceServerClient(ctx.grpc_url())
    except Exception as e:  # noqa: BLE001
        out.status, out.error = "error", f"connect: {e}"
        return None


def unary(ctx, client: str, rng, model: str = MODEL) -> Outcome:
    """One unary request of 4-16 tokens: one response with text and finish_reason length or stop."""
    out = Outcome("llmapi_unary", MODEL, "grpc", client, ctx.new_id())
    c = _client(ctx, out)
    if c is None:
        return out
    n = rng.randint(4, 16)
    try:
        out.t_send = time.monotonic()
        r = c.infer(MODEL, _inputs(rng.choice(PROMPTS), n), request_id=out.request_id, client_timeout=ctx.timeout_s)
        out.times, out.tokens = [time.monotonic()], [n]
        out.text = r.as_numpy("text_output")[0].decode("utf-8", "replace")
        out.finish_reason = r.as_numpy("finish_reason")[0].decode()
        if out.finish_reason not in ("length", "stop"):
            out.problems.append(f"finish_reason {out.finish_reason!r}")
        if out.finish_reason == "length" and not out.text:
            out.problems.append("no text for a request that ran to its length")
    except InferenceServerException as e:
        out.status, out.error = ("stall", str(e)) if "DEADLINE" in str(e.status()) else ("error", e.message())
    finally:
        out.t_end = time.monotonic()
        c.close()
    return out


def stop(ctx, client: str, rng, model: str = MODEL) -> Outcome:
    """A long request, then the stop signal under its id: both are answered CANCELLED."""
    out = Outcome("llmapi_stop", MODEL, "grpc", client, ctx.new_id(), expect="cancel")
    c = _client(ctx, out)
    if c is None:
        return out
    q: queue.Queue = queue.Queue()
    try:
        out.t_send = time.monotonic()
        c.async_infer(MODEL, _inputs(COUNT, 400), request_id=out.request_id,
                      callback=lambda result, error: q.put(("request", error or result)))
        time.sleep(rng.uniform(0.05, 0.5))
        c.async_infer(MODEL, [_t("text_input", np.empty([1], dtype=np.bytes_)), _t("stop", np.array([True]))],
                      request_id=out.request_id, callback=lambda result, error: q.put(("stop", error or result)))
        answers = {}
        deadline = time.monotonic() + ctx.timeout_s
        while len(answers) < 2:
            try:
                who, what = q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                out.status, out.error = "stall", f"{sorted({'request', 'stop'} - set(answers))} unanswered"
                return out
            answers[who] = what
        errors = [w for w in answers.values() if isinstance(w, InferenceServerException)]
        cancelled = [e for e in errors if e.status() == "StatusCode.CANCELLED"]
        if isinstance(answers["stop"], InferenceServerException) and answers["stop"] not in cancelled:
            out.status, out.error = "error", answers["stop"].message()
        elif not isinstance(answers["stop"], InferenceServerException):
            out.problems.append("the stop request was answered without CANCELLED")
        elif isinstance(answers["request"], InferenceServerException) and answers["request"] not in cancelled:
            out.status, out.error = "error", answers["request"].message()
        else:
            out.status = "cancelled"  # the stopped request: CANCELLED (or it had finished first)
    finally:
        out.t_end = time.monotonic()
        c.close()
    return out
