"""Tool calling through the OpenAI frontend and the official `openai` SDK, against the real server
(tests/openai/conftest.py: Triton + the default SmolLM2-135M-Instruct + the frontend).

The default model's template has no tool support, so the frontend describes the tools in the system
prompt in the Hermes `<tool_call>` format (chat_template.ChatRenderer). With "auto" a 135M model
rarely calls a tool, so the calls are tested with tool_choice "required" and a named tool, where the
guided-decoding grammar (tools.guide_for) forces one valid call: its arguments must satisfy the
tool's JSON schema, streamed and not, with finish_reason "stop" (a forced call, as OpenAI and vLLM
answer; "tool_calls" is for calls the model chose under "auto"). About 40 s of requests on
the soak-loaded host, plus the server start when this file runs alone.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

WEATHER_PARAMS = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "days"], "additionalProperties": False}
TIME_PARAMS = {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 16}},
               "required": ["tz"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast of a city",
                                           "parameters": WEATHER_PARAMS}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
                                           "parameters": TIME_PARAMS}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]
COMMON = dict(max_tokens=80, temperature=0)


def validate(value, schema) -> None:
    """A JSON-schema check for the keywords these schemas use; raises AssertionError."""
    t = schema.get("type")
    if t == "object":
        assert isinstance(value, dict), value
        for k in schema.get("required", ()):
            assert k in value, (k, value)
        for k, v in value.items():
            if k in schema.get("properties", {}):
                validate(v, schema["properties"][k])
            else:
                assert schema.get("additionalProperties", True) is not False, (k, value)
    elif t == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), value
    elif t == "string":
        assert isinstance(value, str) and len(value) <= schema.get("maxLength", len(value)), value
    if "enum" in schema:
        assert value in schema["enum"], value


def check_call(name: str, arguments: str, allowed: set[str]) -> dict:
    assert name in allowed, name
    args = json.loads(arguments)
    validate(args, SCHEMAS[name])
    return args


def test_required_not_streamed(openai_server, openai_client):
    r = openai_client.chat.completions.create(model=openai_server.model, messages=MESSAGES, tools=TOOLS,
                                              tool_choice="required", **COMMON)
    (choice,) = r.choices
    assert choice.finish_reason == "stop"
    assert choice.message.content is None and choice.message.role == "assistant"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    check_call(call.function.name, call.function.arguments, set(SCHEMAS))
    assert r.usage.completion_tokens > 5 and r.usage.prompt_tokens > 50  # the tools are in the prompt


def stream_calls(openai_client, model: str, **kw):
    """(content, [(id, name, arguments)], finish_reasons, number of tool-call chunks) of a stream."""
    content, calls, finishes, n_tool_chunks = "", [], [], 0
    for chunk in openai_client.chat.completions.create(model=model, stream=True, **kw):
        for c in chunk.choices:
            if c.finish_reason is not None:
                finishes.append(c.finish_reason)
            d = c.delta
            if d.content:
                content += d.content
            for tc in d.tool_calls or ():
                n_tool_chunks += 1
                if tc.index == len(calls):
                    assert tc.id.startswith("call_") and tc.type == "function" and tc.function.name, tc
                    calls.append([tc.id, tc.function.name, tc.function.arguments or ""])
                else:
                    assert tc.index == len(calls) - 1 and tc.id is None and not tc.function.name, tc
                    calls[-1][2] += tc.function.arguments
    return content, [tuple(c) for c in calls], finishes, n_tool_chunks


def test_named_streamed_matches_not_streamed(openai_server, openai_client):
    """A named tool, streamed: id / type / name first, then argument pieces that join to valid
    arguments, the same as the non-streamed answer (greedy); finish_reason "stop" (forced)."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    content, calls, finishes, n = stream_calls(openai_client, openai_server.model, messages=MESSAGES, tools=TOOLS,
                                               tool_choice=choice, **COMMON)
    assert content == "" and finishes == ["stop"]
    (call,) = calls
    args = check_call(call[1], call[2], {"get_weather"})
    assert n >= 3  # the name, then the arguments in several pieces as they are generated
    r = openai_client.chat.completions.create(model=openai_server.model, messages=MESSAGES, tools=TOOLS,
                                              tool_choice=choice, **COMMON)
    (tc,) = r.choices[0].message.tool_calls
    assert (tc.function.name, json.loads(tc.function.arguments)) == ("get_weather", args)
    assert tc.function.arguments == call[2]


def test_named_other_tool_and_history(openai_server, openai_client):
    """The second tool forced after a first call and its result (assistant tool_calls + a tool message
    in the history): again a valid call of the named tool."""
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 24 C"},
        {"role": "user", "content": "And what time is it in Tokyo?"}]
    r = openai_client.chat.completions.create(model=openai_server.model, messages=history, tools=TOOLS,
                                              tool_choice={"type": "function", "function": {"name": "get_time"}},
                                              **COMMON)
    assert r.choices[0].finish_reason == "stop"
    (tc,) = r.choices[0].message.tool_calls
    check_call(tc.function.name, tc.function.arguments, {"get_time"})


def test_none_and_auto(openai_server, openai_client):
    """"none": never parsed, plain content; "auto": whatever the model writes, the answer is coherent
    (tool_calls exactly when finish_reason is "tool_calls")."""
    r = openai_client.chat.completions.create(model=openai_server.model, messages=MESSAGES, tools=TOOLS,
                                              tool_choice="none", max_tokens=12, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
    r = openai_client.chat.completions.create(model=openai_server.model, messages=MESSAGES, tools=TOOLS,
                                              max_tokens=40, temperature=0)
    msg = r.choices[0].message
    assert (r.choices[0].finish_reason == "tool_calls") == bool(msg.tool_calls)
    for tc in msg.tool_calls or ():
        assert tc.function.name and tc.id.startswith("call_")


@pytest.mark.parametrize("tools, choice, param", [
    ([{"type": "function", "function": {"name": "bad name"}}], "auto", "tools[0].function.name"),
    (TOOLS, {"type": "function", "function": {"name": "missing"}}, "tool_choice.function.name"),
    (TOOLS, "sometimes", "tool_choice"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "dependentSchemas": {}}}}],
     "required", "tools[0].function.parameters"),
])
def test_errors_name_the_parameter(openai_server, openai_client, tools, choice, param):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model=openai_server.model, messages=MESSAGES, tools=tools,
                                              tool_choice=choice, max_tokens=4)
    assert e.value.status_code == 400
    body = e.value.body if isinstance(e.value.body, dict) else {}
    err = body.get("error", body)
    assert err.get("param") == param or param in str(err.get("message")), err
