"""gRPC request kinds of the soak, each one function (ctx, client, rng, model) -> Outcome:
a stream to completion (streamed or not), cancelled mid-stream or before the first token, the
channel dropped mid-stream, and TensorRT-LLM's `stop` (a second request with stop=true and the same
request id on the same stream). Every read is bounded by ctx.stall_s (no response for that long is
a stall) and ctx.timeout_s (the whole request)."""

from __future__ import annotations

import time

import payloads
from records import Outcome
from streams import Stream, StreamTimeout, final
from validate import check_responses, parse_grpc


def _read(ctx, s: Stream, out: Outcome, payload, resps: list, problems: list, stop_after: int | None = None,
          finals_needed: int = 1) -> bool:
    """Read responses into resps until `finals_needed` final responses (True), an error (False,
    out.error set), a stall (False, out.status "stall") or `stop_after` data responses (False)."""
    deadline = out.t_send + ctx.timeout_s
    finals = 0
    # A non-streamed request's responses come only when its sequences end: like HTTP `generate`, it
    # is bounded by the time-out, not by the gap between responses.
    gap = ctx.stall_s if payload.spec.stream else ctx.timeout_s
    while True:
        left = min(gap, deadline - time.monotonic())
        try:
            t, result, error = s.next(timeout=left)
        except StreamTimeout:
            out.status = "stall"
            out.error = (f"no response for {gap:.0f} s after {len(resps)} responses"
                         if left >= gap else f"not finished within the {ctx.timeout_s:.0f} s time-out")
            return False
        if error is not None:
            out.status, out.error = "error", str(error)
            return False
        outputs = result.get_response().outputs
        if outputs and _is_stop_answer(payload.spec.model, result, outputs):
            outputs = None  # the stop request's own answer, not a response of the stopped request
        if outputs:
            r = parse_grpc(payload.spec, result, t, problems)
            resps.append(r)
            if r.tokens or (r.tokens is None and r.text):
                out.times.append(t)
                out.tokens.append(r.tokens or 1)
        if final(result):
            finals += 1
            if finals >= finals_needed:
                return True
        if stop_after is not None and len(resps) >= stop_after:
            return False


def _is_stop_answer(model: str, result, outputs) -> bool:
    """llm answers a stop request with one final response holding only an empty text_output
    (ensemble's answer has no outputs at all)."""
    return (model != "ensemble" and final(result) and [o.name for o in outputs] == ["text_output"]
            and result.as_numpy("text_output").reshape(-1)[0] in (b"", ""))


def _finish(out: Outcome, payload, resps, problems, complete: bool) -> Outcome:
    out.t_end = time.monotonic()
    out.lora = payload.params.get("lora_name") if payload.model != "ensemble" else None
    if complete and out.status == "ok":
        out.ref_key = payload.ref_key()
    out.text = "".join(r.text or "" for r in resps)[:2000]
    if payload.spec.finish_reason and resps:
        out.finish_reason = resps[-1].finish_reason
    problems = problems + check_responses(payload.spec, resps, complete)
    if problems:
        out.problems = problems
        if out.status in ("ok", "cancelled"):
            out.status = "malformed"
    return out


def _open(ctx, out: Outcome):
    try:
        return Stream(ctx.grpc_url())
    except Exception as e:  # noqa: BLE001 - server unreachable: the request fails
        out.status, out.error, out.t_end = "error", f"connect: {e}", time.monotonic()
        return None


def complete(ctx, client: str, rng, model: str, stream: bool = True, n: int = 1, guided: bool = False) -> Outcome:
    """One request read to its final response."""
    payload = payloads.make(model, rng, stream=stream, n=n, guided=guided)
    kind = "grpc_" + ("stream" if stream else "nonstream") + ("_n2" if n > 1 else "") + ("_guided" if guided else "")
    out = Outcome(kind, model, "grpc", client, ctx.new_id())
    s = _open(ctx, out)
    if s is None:
        return out
    resps, problems = [], []
    ok = False
    try:
        out.t_send = s.send(model, payload.grpc_inputs(), out.request_id)
        ok = _read(ctx, s, out, payload, resps, problems)
    except Exception as e:  # noqa: BLE001 - a send on a broken stream
        out.status, out.error = "error", f"send: {e}"
    finally:
        (s.close if ok else s.cancel)()
    return _finish(out, payload, resps, problems, complete=ok)


def cancel_mid(ctx, client: str, rng, model: str) -> Outcome:
    """stop_stream(cancel_requests=True) after 1-4 responses."""
    return _cut(ctx, client, rng, model, "grpc_cancel_mid", rng.randint(1, 4), Stream.cancel)


def drop_mid(ctx, client: str, rng, model: str) -> Outcome:
    """The channel closed under the stream after 1-4 responses (no cancel message sent)."""
    return _cut(ctx, client, rng, model, "grpc_drop_mid", rng.randint(1, 4), Stream.drop)


def _cut(ctx, client, rng, model, kind, k, how) -> Outcome:
    payload = payloads.make(model, rng, long=True)
    out = Outcome(kind, model, "grpc", client, ctx.new_id(), expect="cancel")
    s = _open(ctx, out)
    if s is None:
        return out
    resps, problems = [], []
    ended = False
    try:
        out.t_send = s.send(model, payload.grpc_inputs(), out.request_id)
        ended = _read(ctx, s, out, payload, resps, problems, stop_after=k)
        if not ended and out.error is None:
            out.status = "cancelled"
    except Exception as e:  # noqa: BLE001
        out.status, out.error = "error", f"send: {e}"
    finally:
        how(s)
    return _finish(out, payload, resps, problems, complete=ended)


def cancel_before_first(ctx, client: str, rng, model: str) -> Outcome:
    """stop_stream(cancel_requests=True) 0-40 ms after the send, before any token."""
    payload = payloads.make(model, rng, long=True)
    out = Outcome("grpc_cancel_before_first", model, "grpc", client, ctx.new_id(), expect="cancel")
    s = _open(ctx, out)
    if s is None:
        return out
    try:
        out.t_send = s.send(model, payload.grpc_inputs(), out.request_id)
        time.sleep(rng.uniform(0.0, 0.04))
        out.status = "cancelled"
    except Exception as e:  # noqa: BLE001
        out.status, out.error = "error", f"send: {e}"
    finally:
        s.cancel()
    out.t_end = time.monotonic()
    return out


def trtllm_stop(ctx, client: str, rng, model: str = "ensemble") -> Outcome:
    """After 0-3 responses, a stop=true request with the same request id on the same stream: both
    requests must end with a final response and no error (the stopped one possibly early)."""
    payload = payloads.make(model, rng, long=True)
    payload.spec.stopped = True  # its last response may say finish_reason "abort"
    out = Outcome("grpc_stop_input", model, "grpc", client, ctx.new_id())
    s = _open(ctx, out)
    if s is None:
        return out
    resps, problems = [], []
    ok = False
    try:
        out.t_send = s.send(model, payload.grpc_inputs(), out.request_id)
        k = rng.randint(0, 3)
        done = k > 0 and _read(ctx, s, out, payload, resps, problems, stop_after=k)
        if out.error is None and out.status != "stall":
            s.send(model, payloads.stop_inputs(model), out.request_id)
            # the stop request's own empty final, and the stopped request's final (if it had not ended)
            ok = _read(ctx, s, out, payload, resps, problems, finals_needed=1 if done else 2)
    except Exception as e:  # noqa: BLE001
        out.status, out.error = "error", f"send: {e}"
    finally:
        (s.close if ok else s.cancel)()
    # the stopped request ends early: its last response may carry no finish_reason of its own
    return _finish(out, payload, resps, problems, complete=False)
