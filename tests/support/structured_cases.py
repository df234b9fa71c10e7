"""Structured-output cases shared by the SmolLM2 engine tests (tests/model/test_structured_smollm2.py)
and the OpenAI SDK tests (tests/openai/test_structured_outputs.py, test_tools_strict.py): 20 JSON
schemas with the question a user would ask, and 10 tool sets. None of the schemas says
`additionalProperties` unless the case is about it: closing them is the server's job.

`check(value, schema)` validates with the `jsonschema` package (Draft 2020-12, formats checked),
independent of llguidance and of the server's closing code, against the schema made strict with
JSON Schema's own `unevaluatedProperties: false` at every place an instance object is checked
(root, property values, items, $defs): the keys that the schema's properties / branches / $refs
evaluate are allowed, any other key fails, as the server's closing promises.
"""

from __future__ import annotations

import jsonschema

S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


def obj(props: dict, required=None, **kw) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required, **kw}


POINT = obj({"x": I, "y": I})

# (name, question, schema)
SCHEMAS = [
    ("city_population", "What is the capital of France and its population?", obj({"city": S, "population": I})),
    ("person", "Describe a fictional person with a name, an age and an email address.",
     obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120},
          "email": {"type": "string", "format": "email"}})),
    ("nested_address", "Give the name and postal address of the Louvre museum.",
     obj({"name": S, "address": obj({"street": S, "city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})),
    ("tags", "List a few tags for a blog post about baking bread.",
     obj({"title": S, "tags": {"type": "array", "items": S, "maxItems": 5}})),
    ("enum_color", "What color is the sky on a clear day?", obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("optional_keys", "Describe a book you like.",
     obj({"title": S, "author": S, "pages": I, "subtitle": S}, required=["title"])),
    ("numbers", "Give today's weather reading for London.",
     obj({"temperature": N, "humidity": {"type": "number", "minimum": 0, "maximum": 100}})),
    ("date_ints", "When did the first person land on the moon?",
     obj({"year": {"type": "integer", "minimum": 1900, "maximum": 2100},
          "month": {"type": "integer", "minimum": 1, "maximum": 12},
          "day": {"type": "integer", "minimum": 1, "maximum": 31}})),
    ("booleans", "Is the local library open on Sundays, and does it have parking?",
     obj({"open_on_sunday": B, "has_parking": B})),
    ("nullable", "Give the first, middle and last name of Albert Einstein.",
     obj({"first": S, "middle": {"type": ["string", "null"]}, "last": S})),
    ("date_format", "The team meeting is on 12 June 2025. Give the event and its date.",
     obj({"event": S, "date": {"type": "string", "format": "date"}})),
    ("pattern_code", "Product ABC-123 is made in Italy. Give its code and country.",
     obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "country": S})),
    ("array_of_objects", "List the items of a small grocery order with quantities.",
     obj({"items": {"type": "array", "items": obj({"name": S, "qty": {"type": "integer", "minimum": 1,
                                                                      "maximum": 100}}),
                    "minItems": 1, "maxItems": 3}})),
    ("any_of_shape", "Describe a circle or a square with its size.",
     obj({"shape": {"anyOf": [obj({"kind": {"const": "circle"}, "radius": N}),
                              obj({"kind": {"const": "square"}, "side": N})]}})),
    ("defs_ref", "Give two points on a grid: a start and an end.",
     {"type": "object", "$defs": {"point": POINT},
      "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
      "required": ["start", "end"]}),
    ("deep_nesting", "Describe a company, its CEO and the CEO's age.",
     obj({"company": obj({"name": S, "ceo": obj({"name": S, "age": {"type": "integer", "minimum": 18,
                                                                      "maximum": 100}})})})),
    ("uuid_datetime", "Create a log record with a random id and the current timestamp.",
     obj({"id": {"type": "string", "format": "uuid"}, "created": {"type": "string", "format": "date-time"}})),
    ("all_of", "Give a labelled item with a numeric id.",
     {"type": "object", "allOf": [obj({"id": I}), obj({"label": S})]}),
    ("const_and_enum", "The billing service runs version 2 at log level 3. Report its name, version and log level.",
     obj({"version": {"const": 2}, "level": {"enum": [1, 2, 3]}, "service": S})),
    ("int_array", "List the first five prime numbers.",
     obj({"primes": {"type": "array", "items": I, "minItems": 1, "maxItems": 5}})),
]
# response_format json_object: any object (its keys are the model's)
JSON_OBJECT_QUESTION = "Describe the city of Paris as a JSON object with a few keys."


def _props(name: str, desc: str, params: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}


WEATHER = _props("get_weather", "Current weather of a city", obj({"city": S}))
# (name, question, tools): every set's first tool is the one the question asks for
TOOL_SETS = [
    ("weather", "What's the weather in Paris?", [WEATHER]),
    ("forecast", "Weather in Tokyo for the next 3 days, in celsius?",
     [_props("get_forecast", "Forecast of a city",
             obj({"city": S, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                  "unit": {"enum": ["celsius", "fahrenheit"]}}, required=["city", "days"])), WEATHER]),
    ("email", "Send an email to bob@example.com saying the meeting moved to 3pm.",
     [_props("send_email", "Send an email",
             obj({"to": {"type": "string", "format": "email"}, "subject": S, "body": S}))]),
    ("search", "Search the web for the best pizza in Naples.",
     [_props("web_search", "Search the web", obj({"query": S, "max_results": {"type": "integer", "minimum": 1,
                                                                              "maximum": 10}},
                                                 required=["query"]))]),
    ("calendar", "Create a calendar event 'Dentist' on 2025-03-14 at 10:00.",
     [_props("create_event", "Create a calendar event",
             obj({"title": S, "date": {"type": "string", "format": "date"},
                  "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}}))]),
    ("math", "What is 12 times 7?",
     [_props("multiply", "Multiply two numbers", obj({"a": N, "b": N})),
      _props("add", "Add two numbers", obj({"a": N, "b": N}))]),
    ("shopping", "Add two apples and one loaf of bread to my cart.",
     [_props("add_to_cart", "Add items to the cart",
             obj({"items": {"type": "array", "minItems": 1, "maxItems": 5,
                            "items": obj({"name": S, "qty": {"type": "integer", "minimum": 1, "maximum": 99}})}}))]),
    ("lights", "Turn off the lights in the kitchen.",
     [_props("set_lights", "Switch the lights of a room", obj({"room": {"enum": ["kitchen", "bedroom", "living room"]},
                                                               "on": B}))]),
    ("no_params", "What time is it?", [_props("get_time", "The current time", {"type": "object", "properties": {}})]),
    ("booking", "Book a table for 4 at Luigi's tonight, name Smith.",
     [_props("book_table", "Book a restaurant table",
             {"type": "object", "$defs": {"party": obj({"size": {"type": "integer", "minimum": 1, "maximum": 20},
                                                          "name": S})},
              "properties": {"restaurant": S, "party": {"$ref": "#/$defs/party"},
                             "notes": {"type": ["string", "null"]}},
              "required": ["restaurant", "party"]})]),
]

FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


_NAMING = ("properties", "required", "patternProperties", "$ref", "allOf", "anyOf", "oneOf")


def strict(schema, instance: bool = True):
    """schema with `unevaluatedProperties: false` wherever an instance is checked (instance: this
    node is such a place; branches and $defs are not, their parent or referrer is) and the schema
    names keys without saying what other keys may do (a bare {"type": "object"} stays open)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for k in ("properties", "patternProperties"):
        if isinstance(out.get(k), dict):
            out[k] = {n: strict(s) for n, s in out[k].items()}
    if isinstance(out.get("$defs"), dict):
        out["$defs"] = {n: strict(s, instance=False) for n, s in out["$defs"].items()}
    for k in ("items", "additionalProperties"):
        if isinstance(out.get(k), dict):
            out[k] = strict(out[k])
    if isinstance(out.get("prefixItems"), list):
        out["prefixItems"] = [strict(s) for s in out["prefixItems"]]
    for k in ("anyOf", "oneOf", "allOf"):
        if isinstance(out.get(k), list):
            out[k] = [strict(b, instance=False) for b in out[k]]
    if instance and any(k in schema for k in _NAMING) and not any(
            k in schema for k in ("additionalProperties", "unevaluatedProperties")):
        out["unevaluatedProperties"] = False
    return out


def check(value, schema: dict) -> None:
    """Raise jsonschema.ValidationError unless value satisfies the strict schema (formats checked)."""
    jsonschema.Draft202012Validator(strict(schema), format_checker=FORMAT_CHECKER).validate(value)
