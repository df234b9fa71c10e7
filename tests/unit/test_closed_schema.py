"""Closed JSON schemas and bounded JSON whitespace (paddle_llm_structured), as both contracts apply
them: the closing rules on nested objects, items, branches, $ref / $defs, explicit
`additionalProperties` kept; the meaning of a closed schema checked with the `jsonschema` package
(independent of llguidance) and through llguidance with the SmolLM2 tokenizer; the whitespace
default, and the request's own whitespace options winning."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from paddle_llm_engine import InvalidRequestError
from paddle_llm_engine.guided import GuideSpec
from paddle_llm_structured.any_json import MAX_ENTRIES, any_json_schema
from paddle_llm_structured.closed_schema import close_schema
from paddle_llm_structured.json_layout import DEFAULT_WHITESPACE_PATTERN, json_options
from paddle_llm_triton.contracts import guided as G
from paddle_llm_triton.contracts import trtllm
from paddle_llm_triton.contracts.vllm import from_vllm_json

S, I = {"type": "string"}, {"type": "integer"}


def valid(schema, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_nested_objects_items_and_defs_are_closed():
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": I}}}},
        "list": {"type": "array", "items": {"type": "object", "properties": {"x": S}}},
        "pair": {"type": "array", "prefixItems": [{"type": "object", "properties": {"p": I}}]},
        "ref": {"$ref": "#/$defs/d"}},
        "$defs": {"d": {"properties": {"q": S}, "required": ["q"]}}}
    before = copy.deepcopy(schema)
    c = close_schema(schema)
    assert schema == before  # the input is not changed
    assert c["additionalProperties"] is False
    assert c["properties"]["a"]["additionalProperties"] is False
    assert c["properties"]["a"]["properties"]["b"]["additionalProperties"] is False
    assert c["properties"]["list"]["items"]["additionalProperties"] is False
    assert c["properties"]["pair"]["prefixItems"][0]["additionalProperties"] is False
    assert c["$defs"]["d"]["additionalProperties"] is False  # no `type`: `properties` makes it an object
    assert c["properties"]["ref"] == {"$ref": "#/$defs/d"}  # nothing to add: the shared definition is closed
    good = {"a": {"b": {"c": 1}}, "list": [{"x": "y"}], "pair": [{"p": 1}], "ref": {"q": "z"}}
    assert valid(c, good) and valid(schema, good)
    for bad in ({**good, "extra": 1}, {**good, "a": {"b": {"c": 1, "d": 2}}}, {**good, "list": [{"x": "y", "z": 1}]},
                {**good, "ref": {"q": "z", "r": 1}}, {**good, "pair": [{"p": 1, "o": 2}]}):
        assert valid(schema, bad) and not valid(c, bad), bad


def test_explicit_additional_properties_stay_as_written():
    schema = {"type": "object", "properties": {
        "open": {"type": "object", "properties": {"k": S}, "additionalProperties": True},
        "typed": {"type": "object", "properties": {"k": S}, "additionalProperties": {"type": "object",
                                                                                    "properties": {"v": I}}},
        "map": {"type": "object"},  # names no key: any object (closing it would allow only {})
        "none": {"type": "object", "properties": {}}}}  # names none on purpose: only {}
    c = close_schema(schema)
    p = c["properties"]
    assert p["open"]["additionalProperties"] is True
    assert p["typed"]["additionalProperties"]["additionalProperties"] is False  # closed inside the value schema
    assert "additionalProperties" not in p["map"]
    assert p["none"]["additionalProperties"] is False
    assert valid(c, {"open": {"k": "a", "other": 1}, "typed": {"k": "a", "more": {"v": 1}}, "map": {"any": [1]},
                     "none": {}})
    assert not valid(c, {"typed": {"more": {"v": 1, "w": 2}}})
    assert not valid(c, {"none": {"x": 1}})
    assert close_schema({"type": "object", "unevaluatedProperties": False}) == {"type": "object",
                                                                             "unevaluatedProperties": False}


def test_branches_allow_their_siblings_names():
    """allOf parts intersect: each must allow the names the others name; anyOf / oneOf alternatives
    stay closed on their own, with the parent's names."""
    all_of = {"type": "object", "allOf": [{"properties": {"id": I}, "required": ["id"]}, {"properties": {"label": S}}]}
    c = close_schema(all_of)
    assert valid(c, {"id": 1, "label": "x"}) and valid(c, {"id": 1})
    assert not valid(c, {"id": 1, "label": "x", "extra": True}) and not valid(c, {"id": 1, "label": 2})
    any_of = {"type": "object", "properties": {"kind": S},
              "anyOf": [{"properties": {"a": I}, "required": ["a"]}, {"properties": {"b": I}, "required": ["b"]}]}
    c = close_schema(any_of)
    assert valid(c, {"kind": "k", "a": 1}) and valid(c, {"kind": "k", "b": 2})
    assert not valid(c, {"kind": "k", "a": 1, "z": 0})
    one_of = {"oneOf": [{"type": "object", "properties": {"x": I}, "required": ["x"]},
                        {"type": "object", "properties": {"y": I}, "required": ["y"]}]}
    c = close_schema(one_of)
    assert valid(c, {"x": 1}) and valid(c, {"y": 1}) and not valid(c, {"x": 1, "w": 1})
    assert "additionalProperties" not in c  # the union itself is not an object schema


def test_ref_with_more_names_is_inlined_and_the_definition_stays_closed():
    schema = {"$defs": {"base": {"type": "object", "properties": {"x": S}, "required": ["x"]}},
              "type": "object", "properties": {
                  "plain": {"$ref": "#/$defs/base"},
                  "more": {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"y": I}}]},
                  "sib": {"$ref": "#/$defs/base", "properties": {"z": I}}}}
    c = close_schema(schema)
    assert c["properties"]["plain"] == {"$ref": "#/$defs/base"}
    assert c["$defs"]["base"]["additionalProperties"] is False
    assert valid(c, {"plain": {"x": "a"}, "more": {"x": "a", "y": 1}, "sib": {"x": "a", "z": 2}})
    assert not valid(c, {"plain": {"x": "a", "y": 1}})
    assert not valid(c, {"more": {"x": "a", "y": 1, "w": 0}})
    assert not valid(c, {"sib": {"x": "a", "z": 2, "w": 0}})


def test_recursive_definition_terminates():
    tree = {"$defs": {"node": {"type": "object", "properties": {"v": I, "kids": {"type": "array",
                                                                             "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    c = close_schema(tree)
    assert c["$defs"]["node"]["additionalProperties"] is False
    assert valid(c, {"v": 1, "kids": [{"v": 2, "kids": []}]}) and not valid(c, {"v": 1, "kids": [{"v": 2, "u": 1}]})


def test_data_and_negations_are_not_touched():
    schema = {"type": "object", "properties": {
        "properties": {"type": "object", "properties": {"type": S}},  # a key named "properties"
        "c": {"const": {"properties": {"a": 1}, "type": "object"}},
        "e": {"enum": [{"properties": {}}]},
        "n": {"not": {"type": "object", "properties": {"a": I}}}},
        "default": {"properties": {"x": 1}}}
    c = close_schema(schema)
    assert c["properties"]["c"] == schema["properties"]["c"] and c["properties"]["e"] == schema["properties"]["e"]
    assert c["properties"]["n"] == schema["properties"]["n"] and c["default"] == schema["default"]
    assert c["properties"]["properties"]["additionalProperties"] is False
    assert set(c["properties"]) == {"properties", "c", "e", "n"}
    assert close_schema(True) is True and close_schema({}) == {}


# -- whitespace ------------------------------------------------------------------------------------

def test_json_options():
    assert json_options() == {"whitespace_flexible": False, "whitespace_pattern": DEFAULT_WHITESPACE_PATTERN}
    assert json_options(whitespace_flexible=False) == {"whitespace_flexible": False}
    assert json_options(True, " ?")["whitespace_pattern"] == " ?"
    assert json_options(False, "[ ]{0,3}")["whitespace_pattern"] == "[ ]{0,3}"
    assert json_options(schema={"x-guidance": {"whitespace_flexible": True}}) == {}
    assert json_options(schema={"x-guidance": {"coerce_one_of": True}})["whitespace_pattern"] == DEFAULT_WHITESPACE_PATTERN


@pytest.fixture(scope="module")
def ll_tokenizer(smollm2_dir):
    import llguidance

    return llguidance.LLTokenizer(Path(smollm2_dir, "tokenizer.json").read_text(), eos_token=2)


def accepts(ll_tokenizer, spec: GuideSpec, text: str) -> bool:
    """Whether the guide (as the engine compiles it) accepts exactly `text`."""
    import llguidance

    m = llguidance.LLMatcher(ll_tokenizer, spec.grammar(), log_level=0)
    return m.consume_tokens(ll_tokenizer.tokenize_str(text)) and not m.is_error() and m.is_accepting()


CITY = {"type": "object", "properties": {"city": S, "population": I}, "required": ["city", "population"]}


def test_guide_defaults_close_and_bound(ll_tokenizer):
    """The issue's schema: an invented key, or whitespace runs, were allowed before."""
    spec = GuideSpec("json_schema", json.dumps(CITY))
    assert accepts(ll_tokenizer, spec, '{"city": "Paris", "population": 2100000}')
    assert accepts(ll_tokenizer, spec, '{\n  "city": "Paris",\n  "population": 2100000\n}')
    assert accepts(ll_tokenizer, spec, '{"city":"Paris","population":2100000}')
    assert not accepts(ll_tokenizer, spec, '{"city": "Paris", "population": 2100000, "density": 1}')
    assert not accepts(ll_tokenizer, spec, '{  "city": "Paris", "population": 1}')  # two spaces
    assert not accepts(ll_tokenizer, spec, '{\n\n"city": "Paris", "population": 1}')  # two newlines
    assert not accepts(ll_tokenizer, spec, '{"city": "Paris", "population": 1}\n')  # nothing after the object
    opened = GuideSpec("json_schema", json.dumps(CITY), additional_properties=True)
    assert accepts(ll_tokenizer, opened, '{"city": "Paris", "population": 1, "density": 1}')
    any_obj = GuideSpec("json_object")
    assert accepts(ll_tokenizer, any_obj, '{"anything": [1, {"b": null}], "more": "x", "n": -1.5e3, "t": true}')
    assert not accepts(ll_tokenizer, any_obj, '{"a":  1}')
    assert not accepts(ll_tokenizer, any_obj, "[1]")


def test_json_object_entries_are_bounded(ll_tokenizer):
    """Any object, but each object / array holds at most MAX_ENTRIES entries (a greedy model invents
    keys forever otherwise)."""
    def obj(n):
        return "{" + ", ".join(f'"k{i}": {i}' for i in range(n)) + "}"

    def arr(n):
        return '{"a": [' + ", ".join(str(i) for i in range(n)) + "]}"

    spec = GuideSpec("json_object")
    assert accepts(ll_tokenizer, spec, obj(MAX_ENTRIES)) and not accepts(ll_tokenizer, spec, obj(MAX_ENTRIES + 1))
    assert accepts(ll_tokenizer, spec, arr(MAX_ENTRIES)) and not accepts(ll_tokenizer, spec, arr(MAX_ENTRIES + 1))
    nested = '{"o": ' + obj(MAX_ENTRIES + 1) + "}"
    assert not accepts(ll_tokenizer, spec, nested)
    schema = any_json_schema(("object", "array"))
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(arr(3))["a"])
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(obj(MAX_ENTRIES + 1)))


def test_request_whitespace_wins(ll_tokenizer):
    compact = GuideSpec("json_schema", json.dumps(CITY), whitespace_flexible=False)
    assert accepts(ll_tokenizer, compact, '{"city":"Paris","population":1}')
    assert not accepts(ll_tokenizer, compact, '{"city": "Paris","population":1}')
    wide = GuideSpec("json_schema", json.dumps(CITY), whitespace_flexible=False, whitespace_pattern=r"[ \n]{1,6}")
    assert accepts(ll_tokenizer, wide, '{   "city":  "Paris",\n\n "population": 1}')
    own = dict(CITY, **{"x-guidance": {"whitespace_flexible": True}})  # the schema's own option
    assert accepts(ll_tokenizer, GuideSpec("json_schema", json.dumps(own)), '{\n\n\n   "city": "P", "population": 1}')


# -- contracts -------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"structured_outputs": {"json": CITY}},
    {"guided_decoding": {"json": json.dumps(CITY), "disable_additional_properties": False}},
    {"structured_outputs": {"json": CITY, "disable_additional_properties": True}},
])
def test_vllm_contract_closes_every_json_schema(body, ll_tokenizer):
    """disable_additional_properties false (what vLLM clients send by default) does not open a schema."""
    spec = from_vllm_json(json.dumps(body)).guide
    assert not spec.additional_properties and spec.whitespace_flexible and spec.whitespace_pattern is None
    assert not accepts(ll_tokenizer, spec, '{"city": "P", "population": 1, "x": 0}')
    assert accepts(ll_tokenizer, spec, '{"city": "P", "population": 1}')
    again = from_vllm_json(json.dumps({"structured_outputs": G.to_vllm(spec)})).guide
    assert (again.additional_properties, again.whitespace_flexible, again.whitespace_pattern) == (False, True, None)


def test_trtllm_contract_closes_json_schema_and_keeps_any_json(ll_tokenizer):
    spec = trtllm.from_trtllm_tensors({"guided_decoding_guide_type": "json_schema",
                                       "guided_decoding_guide": json.dumps(CITY)}, 49152).guide
    assert not accepts(ll_tokenizer, spec, '{"city": "P", "population": 1, "x": 0}')
    assert accepts(ll_tokenizer, spec, '{\n  "city": "P",\n  "population": 1\n}')
    any_json = trtllm.from_trtllm_tensors({"guided_decoding_guide_type": "json"}, 49152).guide
    assert accepts(ll_tokenizer, any_json, '{"k": 1, "other": [true]}') and accepts(ll_tokenizer, any_json, "[1, 2]")
    assert not accepts(ll_tokenizer, any_json, '{"k":   1}')


def test_closing_an_unsatisfiable_combination_is_still_a_clear_error():
    """A schema llguidance cannot compile stays an InvalidRequestError naming the field."""
    bad = {"type": "object", "properties": {"a": I}, "dependentSchemas": {"a": {"required": ["b"]}}}
    with pytest.raises(InvalidRequestError) as e:
        GuideSpec("json_schema", json.dumps(bad), field="guided_decoding_guide").check()
    assert e.value.field == "guided_decoding_guide"


def test_unbounded_integers_get_rfc8259s_interoperable_range_and_explicit_bounds_stay():
    """Each open side of an integer gets +-(2**53 - 1) (RFC 8259 section 6); a bound the schema sets,
    exclusive or not, stays; numbers are left alone; nullable integers keep null."""
    import jsonschema

    from paddle_llm_structured.closed_schema import INTEROPERABLE_INT

    schema = {"type": "object", "properties": {
        "n": {"type": "integer"}, "pos": {"type": "integer", "minimum": 0},
        "capped": {"type": "integer", "exclusiveMaximum": 10}, "maybe": {"type": ["integer", "null"]},
        "x": {"type": "number"}, "tags": {"type": "array", "items": {"type": "integer"}}}}
    closed = close_schema(schema)
    p = closed["properties"]
    assert (p["n"]["minimum"], p["n"]["maximum"]) == (-INTEROPERABLE_INT, INTEROPERABLE_INT) == (-(2**53 - 1), 2**53 - 1)
    assert p["pos"]["minimum"] == 0 and p["pos"]["maximum"] == INTEROPERABLE_INT
    assert "maximum" not in p["capped"] and p["capped"]["exclusiveMaximum"] == 10
    assert "maximum" not in p["x"] and "minimum" not in p["x"]
    assert p["tags"]["items"]["maximum"] == INTEROPERABLE_INT
    ok = {"n": 2**53 - 1, "maybe": None, "pos": 0}
    jsonschema.validate(ok, closed)
    for bad in ({"n": 2**53}, {"pos": -1}, {"maybe": -(2**53)}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, closed)
    assert schema["properties"]["n"] == {"type": "integer"}  # the input is not changed
