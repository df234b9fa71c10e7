"""HTTP request kinds of the soak (Triton's generate extension, plain `requests` and sockets), each
one function (ctx, client, rng, model) -> Outcome: non-streamed generate, generate_stream (SSE) read
to the end, generate_stream closed by the client after a few events, and a raw socket that sends a
generate_stream request and resets the connection (SO_LINGER 0) after the first event."""

from __future__ import annotations

import json
import socket
import struct
import time

import requests

import payloads
from http_clients import iter_sse  # tests/support
from records import Outcome
from validate import check_responses, parse_json


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


def _fail(out: Outcome, e: Exception) -> None:
    # requests reports a read time-out inside a streamed body as a ConnectionError
    if isinstance(e, (requests.Timeout, socket.timeout, TimeoutError)) or "Read timed out" in str(e):
        out.status, out.error = "stall", f"HTTP time-out: {e}"
    else:
        out.status, out.error = "error", f"{type(e).__name__}: {e}"


def _error_body(r) -> str:
    try:
        body = r.json()
        return body.get("error", r.text) if isinstance(body, dict) else r.text
    except ValueError:
        return r.text


def generate(ctx, client: str, rng, model: str, guided: bool = False) -> Outcome:
    """Non-streamed POST /v2/models/<m>/generate (exactly one response)."""
    payload = payloads.make(model, rng, stream=False, guided=guided)
    out = Outcome("http_generate" + ("_guided" if guided else ""), model, "http", client, ctx.new_id())
    resps, problems = [], []
    out.t_send = time.monotonic()
    try:
        # its one response comes after the whole generation: only the request's time-out bounds it
        # (a 2-hour soak saw 80-token guided requests take 23-30 s on a loaded host, judged stalls at 30 s)
        r = requests.post(f"{ctx.http_base()}/v2/models/{model}/generate", json=payload.http_json(),
                          timeout=(5, ctx.timeout_s))
        out.http_status = r.status_code
        if r.status_code != 200:
            out.status, out.error = "error", f"HTTP {r.status_code}: {_error_body(r)}"
        else:
            body = r.json()
            if "error" in body:
                out.status, out.error = "error", f"HTTP 200 with error: {body['error']}"
            else:
                t = time.monotonic()
                resps.append(parse_json(payload.spec, body, t, problems))
                out.times.append(t)
                out.tokens.append(resps[-1].tokens or 1)
    except (requests.RequestException, ValueError) as e:
        _fail(out, e)
    return _finish(out, payload, resps, problems, complete=out.status == "ok")


def stream(ctx, client: str, rng, model: str, close_after: int | None = None) -> Outcome:
    """generate_stream read to the end, or closed by the client after `close_after` events."""
    payload = payloads.make(model, rng, long=close_after is not None)
    kind = "http_stream" if close_after is None else "http_stream_close"
    out = Outcome(kind, model, "http", client, ctx.new_id(), expect="ok" if close_after is None else "cancel")
    resps, problems = [], []
    out.t_send = time.monotonic()
    deadline = out.t_send + ctx.timeout_s
    try:
        with requests.post(f"{ctx.http_base()}/v2/models/{model}/generate_stream", json=payload.http_json(),
                           stream=True, timeout=(5, ctx.stall_s)) as r:
            out.http_status = r.status_code
            if r.status_code != 200:
                out.status, out.error = "error", f"HTTP {r.status_code}: {_error_body(r)}"
            else:
                for ev in iter_sse(r):
                    t = time.monotonic()
                    if "error" in ev:
                        out.status, out.error = "error", f"SSE error event: {ev['error']}"
                        break
                    resps.append(parse_json(payload.spec, ev, t, problems))
                    out.times.append(t)
                    out.tokens.append(resps[-1].tokens or 1)
                    if close_after is not None and len(resps) >= close_after:
                        out.status = "cancelled"
                        break
                    if t > deadline:
                        out.status, out.error = "stall", f"not finished within the {ctx.timeout_s:.0f} s time-out"
                        break
    except (requests.RequestException, ValueError) as e:
        _fail(out, e)
    complete = out.status == "ok"
    if complete and close_after is not None:  # it ended before the client closed it
        out.status = "ok"
    return _finish(out, payload, resps, problems, complete=complete)


def close_mid(ctx, client: str, rng, model: str) -> Outcome:
    """generate_stream closed by the client after 1-4 events."""
    return stream(ctx, client, rng, model, close_after=rng.randint(1, 4))


def socket_reset(ctx, client: str, rng, model: str) -> Outcome:
    """A client that vanishes: raw HTTP/1.1 generate_stream, read the first event, then RST."""
    payload = payloads.make(model, rng, long=True)
    out = Outcome("http_socket_reset", model, "http", client, ctx.new_id(), expect="cancel")
    host, port = ctx.http_base().split("//", 1)[1].split(":")
    body = json.dumps(payload.http_json()).encode()
    req = (f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: {host}:{port}\r\n"
           f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    out.t_send = time.monotonic()
    sock = None
    try:
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.settimeout(ctx.stall_s)
        sock.sendall(req)
        data = b""
        while b"data:" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                out.status, out.error = "error", f"connection closed by the server: {data[:300]!r}"
                break
            data += chunk
        if out.error is None:
            head = data.split(b"\r\n", 1)[0]
            if b" 200 " not in head + b" ":
                out.status, out.error = "error", f"HTTP status line {head!r}: {data[:300]!r}"
            else:
                out.times.append(time.monotonic())
                out.tokens.append(1)
                out.status = "cancelled"
    except OSError as e:
        _fail(out, e)
    finally:
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            sock.close()
    out.t_end = time.monotonic()
    return out
