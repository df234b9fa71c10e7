"""OpenAI-frontend request kinds of the soak (the frontend `make serve` starts beside Triton, with an API
key), each one function (ctx, client, rng, model) -> Outcome with protocol "openai" and model "llm"
(the Triton model behind it, so the llm stub's faults explain its errors):

- chat: greedy chat completion, streamed (SSE read to [DONE]) or not; the streamed deltas must join
  to the text (the same greedy request in both modes must give the same text: ref_key);
- json: response_format json_schema (strict, a schema from SCHEMAS): an answer that ended by itself
  must parse and validate (the `jsonschema` package); one that did not is malformed too, since closed
  schemas with bounded whitespace let a greedy model close its object;
- tool: tool_choice "required" with TOOLS: the call must parse and its arguments validate;
- close: a stream the client closes after its first event (cancelled, as planned);
- bad: temperature 3 (400 naming `temperature`, OpenAI's range);
- unauthorized: no API key (401, expected);
- admin: Triton's repository API without the launcher's secret (403 from Triton, expected).
"""

from __future__ import annotations

import json
import time

import jsonschema
import requests

from records import Outcome

API_KEY = "sk-soak-0123456789abcdef"  # the soak server's VLLM_API_KEY (server.py)
PROMPTS = ["What is the capital of France?", "Name three colours.", "Say hello in Spanish.",
           "Write one sentence about the sea.", "Count from one to five."]
# bounded as docs/features/structured_outputs.md asks of schema authors (maxLength, maxItems, a maximum):
# without them greedy SmolLM2 ran to max_tokens inside a string 8 times in 101 ("Shelter_2023_2023_...")
SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                      "population": {"type": "integer", "minimum": 0, "maximum": 10 ** 10}},
     "required": ["city", "population"]},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 200},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 30},
                                               "maxItems": 3}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number"}},
     "required": ["answer"]},
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}]


def _headers(key: str | None = API_KEY) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _out(ctx, scenario: str, client: str, expect: str = "ok") -> Outcome:
    return Outcome(scenario, "llm", "openai", client, ctx.new_id(), expect=expect)


def _error(out: Outcome, r: requests.Response) -> None:
    out.http_status = r.status_code
    try:
        err = r.json().get("error") or {}
        msg = f"{err.get('param')}: {err.get('message')}" if err.get("param") else str(err.get("message"))
    except ValueError:
        msg = r.text[:300]
    out.status, out.error = "error", f"HTTP {r.status_code}: {msg}"


def _fail(out: Outcome, e: Exception) -> None:
    if isinstance(e, requests.Timeout) or "Read timed out" in str(e):
        out.status, out.error = "stall", f"HTTP time-out: {e}"
    else:
        out.status, out.error = "error", f"{type(e).__name__}: {e}"


def _chat_body(rng, **extra) -> dict:
    return {"model": "llm", "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": rng.choice((8, 16, 32)), "temperature": 0, **extra}


def _stream(ctx, out: Outcome, body: dict, close_after: int | None = None) -> dict:
    """POST a streamed chat; fills out.times / tokens / text; returns {"finish": reason}."""
    finish = None
    with requests.post(f"{ctx.openai_base()}/v1/chat/completions", json=dict(body, stream=True),
                       headers=_headers(), stream=True, timeout=(10, ctx.stall_s)) as r:
        if r.status_code != 200:
            _error(out, r)
            return {}
        out.http_status = 200
        parts, events = [], 0
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                out.status, out.error = "error", f"stream error event: {ev['error'].get('message')}"
                return {}
            events += 1
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content") or ""
                if piece:
                    parts.append(piece)
                    out.times.append(time.monotonic())
                    out.tokens.append(1)
                finish = ch.get("finish_reason") or finish
            if close_after is not None and events >= close_after:
                out.status = "cancelled"
                return {}
        out.text = "".join(parts)
        if finish is None:
            out.problems.append("stream ended without a finish_reason")
    return {"finish": finish}


def _complete(ctx, out: Outcome, body: dict) -> dict | None:
    """POST a non-streamed chat completion; fills out's status, text, finish_reason, time and tokens;
    returns its first choice (None after an error, recorded in out)."""
    r = requests.post(f"{ctx.openai_base()}/v1/chat/completions", json=body, headers=_headers(),
                      timeout=ctx.timeout_s)
    if r.status_code != 200:
        _error(out, r)
        return None
    out.http_status = 200
    ch = r.json()["choices"][0]
    out.text, out.finish_reason = ch["message"].get("content") or "", ch["finish_reason"]
    out.times.append(time.monotonic())
    out.tokens.append(r.json()["usage"]["completion_tokens"])
    return ch


def _run(ctx, out: Outcome, send) -> Outcome:
    """send() inside the bounds of one request: errors recorded, malformed when problems were found."""
    out.t_send = time.monotonic()
    try:
        send()
    except Exception as e:  # noqa: BLE001
        _fail(out, e)
    out.t_end = time.monotonic()
    if out.problems and out.status == "ok":
        out.status = "malformed"
    return out


def chat(ctx, client: str, rng, model: str = "llm") -> Outcome:
    stream = rng.random() < 0.6
    out = _out(ctx, "openai_chat_stream" if stream else "openai_chat", client)
    body = _chat_body(rng)

    def send():
        if stream:
            out.finish_reason = _stream(ctx, out, body).get("finish")
        elif _complete(ctx, out, body) is None:
            return
        if out.status == "ok":
            if out.finish_reason not in ("stop", "length"):
                out.problems.append(f"finish_reason {out.finish_reason!r}")
            out.ref_key = f"openai:{body['messages'][0]['content']}:{body['max_tokens']}"
    return _run(ctx, out, send)


def json_schema(ctx, client: str, rng, model: str = "llm") -> Outcome:
    k = rng.randrange(len(SCHEMAS))
    out = _out(ctx, "openai_json", client)
    body = _chat_body(rng, max_tokens=150, response_format={
        "type": "json_schema", "json_schema": {"name": f"s{k}", "strict": True, "schema": SCHEMAS[k]}})
    body["messages"][0]["content"] = "Answer in JSON: " + body["messages"][0]["content"]

    def send():
        if _complete(ctx, out, body) is None:
            return
        if out.finish_reason != "stop":
            out.problems.append(f"json_schema answer ended with {out.finish_reason!r}, not closed")
            return
        try:
            jsonschema.validate(json.loads(out.text), SCHEMAS[k])
        except (ValueError, jsonschema.ValidationError) as e:
            out.problems.append(f"answer does not validate against schema {k}: {str(e)[:200]}")
    return _run(ctx, out, send)


def tool(ctx, client: str, rng, model: str = "llm") -> Outcome:
    out = _out(ctx, "openai_tool", client)
    body = _chat_body(rng, max_tokens=100, tools=TOOLS, tool_choice="required")
    body["messages"][0]["content"] = f"What is the weather in {rng.choice(['Paris', 'Tokyo', 'Lima'])}?"

    def send():
        ch = _complete(ctx, out, body)
        if ch is None:
            return
        calls = ch["message"].get("tool_calls") or []
        if not calls:
            out.problems.append(f"tool_choice required gave no call: {str(ch['message'])[:200]}")
        for c in calls:
            try:
                jsonschema.validate(json.loads(c["function"]["arguments"]), TOOLS[0]["function"]["parameters"])
            except (ValueError, KeyError, jsonschema.ValidationError) as e:
                out.problems.append(f"tool call arguments do not validate: {str(e)[:200]}")
        out.text = json.dumps([c["function"] for c in calls])[:2000]
    return _run(ctx, out, send)


def _record(out: Outcome, r: requests.Response) -> None:
    """The answer's status into out: 200 as it is, anything else as an error with its message."""
    if r.status_code == 200:
        out.http_status = 200
    else:
        _error(out, r)


def close_mid(ctx, client: str, rng, model: str = "llm") -> Outcome:
    out = _out(ctx, "openai_stream_close", client, expect="cancel")

    def send():
        _stream(ctx, out, _chat_body(rng, max_tokens=200, ignore_eos=True), close_after=2)
        if out.status == "ok":  # ended before the client could close it: fine, but not what was planned
            out.status = "cancelled"
    return _run(ctx, out, send)


def bad(ctx, client: str, rng, model: str = "llm") -> Outcome:
    out = _out(ctx, "openai_bad_input", client, expect="invalid_arg:temperature")
    return _run(ctx, out, lambda: _record(out, requests.post(
        f"{ctx.openai_base()}/v1/chat/completions", json=_chat_body(rng, temperature=3), headers=_headers(),
        timeout=ctx.timeout_s)))


def unauthorized(ctx, client: str, rng, model: str = "llm") -> Outcome:
    out = _out(ctx, "openai_unauthorized", client, expect="http:401")
    key = rng.choice((None, "sk-wrong-key"))
    return _run(ctx, out, lambda: _record(out, requests.post(
        f"{ctx.openai_base()}/v1/chat/completions", json=_chat_body(rng), headers=_headers(key),
        timeout=ctx.timeout_s)))


def admin(ctx, client: str, rng, model: str = "llm") -> Outcome:
    out = _out(ctx, "admin_api_refused", client, expect="http:403")
    out.protocol, out.model = "http", "triton"  # a server-level request, no model's
    method, path = rng.choice((("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/llm/unload"),
                               ("GET", "/v2/systemsharedmemory/status")))
    return _run(ctx, out, lambda: _record(out, requests.request(method, f"{ctx.http_base()}{path}",
                                                                timeout=ctx.timeout_s)))
