"""Structured outputs and strict tool calls end to end: the official `openai` SDK -> the frontend ->
Triton's `llm` (tests/openai/conftest.py), on the default SmolLM2-135M-Instruct, as the issue's user
sent them. Answers validate with `jsonschema` against the schema made strict
(tests/support/structured_cases.py). A subset of the engine-level tests (tests/model/test_structured_smollm2.py,
test_tools_smollm2.py), requests sent concurrently; about a minute of requests.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from structured_cases import SCHEMAS, TOOL_SETS, WEATHER, check, obj

pytestmark = pytest.mark.e2e

CITY = obj({"city": {"type": "string"}, "population": {"type": "integer"}})
ISSUE = [{"role": "user", "content": "What is the capital of France and its population?"}]
SUBSET = ("person", "nested_address", "any_of_shape", "defs_ref", "all_of", "int_array")
NUDGE = {"44": 4, "19324": 4}  # SmolLM2's "<" and "tool": the model then starts `<tool_call>` itself


def rf(schema, strict=None) -> dict:
    js = {"name": "answer", "schema": schema}
    if strict is not None:
        js["strict"] = strict
    return {"type": "json_schema", "json_schema": js}


@pytest.mark.parametrize("strict", [True, None])
def test_the_issue_city_population_parses(openai_server, openai_client, strict):
    """The issue: strict json_schema {city, population}, temperature 0, max_tokens 200 gave 591
    characters of invented keys and whitespace, finish_reason length. Now: exactly the two keys,
    "stop", with or without strict."""
    r = openai_client.chat.completions.create(model=openai_server.model, messages=ISSUE, temperature=0,
                                              max_tokens=200, response_format=rf(CITY, strict))
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    value = json.loads(c.message.content)
    check(value, CITY)
    assert set(value) == {"city", "population"} and len(c.message.content) < 100


@pytest.mark.parametrize("question", ["What is the capital of France?",
                                      "Give the city and population of the capital of Japan.",
                                      "Which city is the capital of Japan and how many people live there?"])
def test_pydantic_parse_of_an_unbounded_integer_closes(openai_server, openai_client, question):
    """A new user's check: the SDK's parse() into a pydantic class {city: str, population: int}. The
    schema bounds no integer, and greedy SmolLM2 wrote "population": 1111... until max_tokens for
    these three questions (LengthFinishReasonError); integers now get RFC 8259's interoperable range,
    so the number ends within 16 digits and the object closes."""
    import pydantic

    class City(pydantic.BaseModel):
        city: str
        population: int

    r = openai_client.beta.chat.completions.parse(model=openai_server.model, temperature=0, max_tokens=200,
                                                   messages=[{"role": "user", "content": question}],
                                                   response_format=City)
    c = r.choices[0]
    assert c.finish_reason == "stop" and isinstance(c.message.parsed, City), c.message.content
    assert abs(c.message.parsed.population) <= 2 ** 53 - 1


def test_schemas_greedy_and_streamed(openai_server, async_openai_client):
    """Six of the 20 schemas, greedy, concurrently: each answer stops, parses and validates; the
    streamed answer of one joins to the same text."""
    cases = [c for c in SCHEMAS if c[0] in SUBSET]

    async def one(question, schema):
        return await async_openai_client.chat.completions.create(
            model=openai_server.model, messages=[{"role": "user", "content": question}], temperature=0,
            max_tokens=200, response_format=rf(schema, True))

    async def streamed(question, schema):
        parts = []
        stream = await async_openai_client.chat.completions.create(
            model=openai_server.model, messages=[{"role": "user", "content": question}], temperature=0,
            max_tokens=200, response_format=rf(schema, True), stream=True)
        async for chunk in stream:
            parts += [ch.delta.content or "" for ch in chunk.choices]
        return "".join(parts)

    async def run():
        return await asyncio.gather(*[one(q, s) for _, q, s in cases], streamed(cases[0][1], cases[0][2]))

    *answers, text = asyncio.run(run())
    for (name, _, schema), r in zip(cases, answers):
        assert r.choices[0].finish_reason == "stop", (name, r.choices[0].message.content)
        check(json.loads(r.choices[0].message.content), schema)
    assert text == answers[0].choices[0].message.content


def test_json_object_ends_in_an_object(openai_server, openai_client):
    r = openai_client.chat.completions.create(
        model=openai_server.model, temperature=0, max_tokens=200, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Describe the city of Paris as a JSON object with a few keys."}])
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_required_weather_call_has_only_the_schema_keys(openai_server, openai_client):
    """The issue's tool case: "required" get_weather(city) gave {"city":"Paris","type":"string"}."""
    r = openai_client.chat.completions.create(
        model=openai_server.model, messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=200)
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.message.tool_calls
    for call in c.message.tool_calls:
        args = json.loads(call.function.arguments)
        check(args, WEATHER["function"]["parameters"])
        assert set(args) == {"city"}


def test_auto_calls_validate_and_finish_with_tool_calls(openai_server, async_openai_client):
    """"auto" nudged to call (logit_bias, the client's own parameter) over the 10 tool sets, one call
    each (parallel_tool_calls false): every answer is text or one valid call; a call ends the answer
    with finish_reason "tool_calls"."""
    async def one(question, tools):
        return await async_openai_client.chat.completions.create(
            model=openai_server.model, messages=[{"role": "user", "content": question}], tools=tools,
            tool_choice="auto", parallel_tool_calls=False, logit_bias=NUDGE, temperature=0, max_tokens=200)

    async def run():
        return await asyncio.gather(*[one(q, t) for _, q, t in TOOL_SETS])

    called = 0
    for (name, _, tools), r in zip(TOOL_SETS, asyncio.run(run())):
        c = r.choices[0]
        if not c.message.tool_calls:
            assert c.finish_reason in ("stop", "length"), name
            continue
        called += 1
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, (name, c)
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        call = c.message.tool_calls[0].function
        check(json.loads(call.arguments), schemas[call.name])
    print(f"\nauto, nudged, one call: {called} of {len(TOOL_SETS)} answers called a tool")
    assert called >= 5
