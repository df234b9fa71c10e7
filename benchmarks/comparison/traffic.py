"""The HTTP load clients of benchmarks/compare.py: streamed requests to llama.cpp's /completion and to
the OpenAI frontend's /v1/completions, each recording per-token arrival times (perf_counter seconds),
and the client threads that keep C streams busy until the level's requests are sent or its time cap
passes. The gRPC systems use client_examples/load_client.run_load instead."""

from __future__ import annotations

import json
import threading
import time


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
