"""Close a JSON schema: every object allows only the keys the schema names.

JSON Schema leaves objects open (`additionalProperties` absent = any other key with any value), and a
small model given an open schema invents keys until max_tokens. xgrammar's strict mode (vLLM's
default backend) and OpenAI's strict structured outputs treat an absent `additionalProperties` as
false; close_schema makes that explicit for llguidance, which follows JSON Schema.

Rules:
- an object schema (`type` object, or no `type` and `properties` / `required` / `patternProperties`)
  without `additionalProperties`, `unevaluatedProperties` or `propertyNames` gets
  `additionalProperties: false`; an explicit `additionalProperties` (true, false or a schema) stays;
- the keys it allows are the ones the schema names for that object: its `properties`, `required`,
  `patternProperties`, and the names its `allOf` / `anyOf` / `oneOf` branches and `$ref` target name
  (llguidance intersects sibling keywords, so each part must allow the other parts' keys: a name
  named elsewhere gets `true` in that part's `properties`; an `anyOf` / `oneOf` branch does not get
  its sibling branches' names, so each alternative stays closed on its own);
- a `$ref` that must allow more names than its target names is inlined (a copy of the target), so
  the shared definition stays closed for its other uses;
- an object that names no key and has no `properties` (`{"type": "object"}`: any object, as
  `json_object` asks) stays open; `"properties": {}` names none on purpose and allows only `{}`;
- an integer the schema leaves unbounded gets RFC 8259's interoperable range (section 6: integers in
  [-(2**53 - 1), 2**53 - 1] are exact in every JSON parser) on each side it leaves open, at most 16
  digits: a greedy small model otherwise repeats a digit until max_tokens (SmolLM2 did for 3 of 8
  city/population questions); an explicit minimum / maximum (exclusive or not) stays as written;
- applied recursively: `properties`, `patternProperties`, `additionalProperties` / `items` /
  `prefixItems` / `contains` schemas, branches, `$defs` / `definitions`; never inside `not` / `if` /
  `then` / `else` / `dependentSchemas` (closing there would change which instances they select)
  nor in values that are data (`enum`, `const`, `default`, `examples`).
"""

from __future__ import annotations

import copy

_ONE = ("items", "additionalItems", "contains", "additionalProperties", "unevaluatedItems",
        "unevaluatedProperties", "propertyNames")  # value: one subschema
_LIST = ("prefixItems", "items")  # value: a list of subschemas (`items` as a list: draft-4 tuples)
_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # value: name -> subschema
_BRANCHES = ("allOf", "anyOf", "oneOf")
_OWN_RULE = ("additionalProperties", "unevaluatedProperties", "propertyNames")  # the schema says how
_OBJECT_HINTS = ("properties", "required", "patternProperties")
INTEROPERABLE_INT = 2 ** 53 - 1  # RFC 8259 section 6


def close_schema(schema):
    """A copy of `schema` (a JSON schema as parsed JSON: dict or bool) with every object closed as
    the module docstring says; the input is not changed. Non-dict values are returned as they are.
    Never raises on odd schemas: keywords it does not know are copied unchanged (llguidance reports
    what it cannot compile)."""
    if not isinstance(schema, dict):
        return schema
    return _Closer(schema).node(schema, {}, ())


def _ordered(*parts) -> dict:
    """Ordered set (dict keys) of the names in parts, first appearance first."""
    out: dict = {}
    for p in parts:
        out.update(dict.fromkeys(p))
    return out


def _is_object(node: dict) -> bool:
    t = node.get("type")
    if isinstance(t, str):
        return t == "object"
    if isinstance(t, list):
        return "object" in t
    return any(k in node for k in _OBJECT_HINTS)


def _is_integer(node: dict) -> bool:
    t = node.get("type")
    # ["integer", "null"] too: bounds apply to numbers only (JSON Schema), so null stays allowed
    return t == "integer" or (isinstance(t, list) and "integer" in t and "number" not in t)


def _own_names(node: dict) -> dict:
    props = node.get("properties")
    req = node.get("required")
    return _ordered(props if isinstance(props, dict) else (),
                    [r for r in req if isinstance(r, str)] if isinstance(req, list) else ())


class _Closer:
    """Closing of one schema (the root, for resolving local `$ref`s)."""

    def __init__(self, root: dict):
        self.root = root

    def resolve(self, ref):
        """The target of a local `$ref` ("#", "#/$defs/x", JSON pointer), or None."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def names(self, node, seen: tuple = ()) -> dict:
        """The keys `node` names for its object: its own and those of its branches and $ref target."""
        if not isinstance(node, dict):
            return {}
        parts = [_own_names(node)]
        for k in _BRANCHES:
            if isinstance(node.get(k), list):
                parts += [self.names(b, seen) for b in node[k]]
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in seen:
            parts.append(self.names(self.resolve(ref), seen + (ref,)))
        return _ordered(*parts)

    def node(self, node, extra: dict, inlining: tuple):
        """`node` closed; extra: names other parts of the same object name (they must be allowed
        here too); inlining: the $refs being inlined above (a recursive definition stops there)."""
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in inlining and isinstance(self.resolve(ref), dict):
            rest = {k: v for k, v in node.items() if k != "$ref"}
            if extra or self.names(rest):  # the target must allow names it does not name itself
                target = copy.deepcopy(self.resolve(ref))
                merged = {**rest, "allOf": [target] + list(rest.get("allOf", ()))} if rest else target
                return self.node(merged, extra, inlining + (ref,))
        groups = {k: [self.names(b) for b in node[k]] for k in _BRANCHES if isinstance(node.get(k), list)}
        base = _ordered(_own_names(node), extra, self.names(self.resolve(ref)) if isinstance(ref, str) else ())
        visible = _ordered(base, *[n for g in groups.values() for n in g])
        out = {}
        for k, v in node.items():
            if k in groups:
                # allOf parts must allow every name of the object; an anyOf / oneOf alternative
                # all but its sibling alternatives' names
                others = _ordered(*[n for g, ns in groups.items() if g != k for n in ns])
                out[k] = [self.node(b, visible if k == "allOf" else _ordered(base, others), inlining) for b in v]
            elif k in _MAPS and isinstance(v, dict):
                out[k] = {name: self.node(s, {}, ()) for name, s in v.items()}
            elif k in _ONE and isinstance(v, dict):
                out[k] = self.node(v, {}, ())
            elif k in _LIST and isinstance(v, list):
                out[k] = [self.node(s, {}, ()) for s in v]
            else:
                out[k] = v
        if _is_integer(node):
            if "maximum" not in node and "exclusiveMaximum" not in node:
                out["maximum"] = INTEROPERABLE_INT
            if "minimum" not in node and "exclusiveMinimum" not in node:
                out["minimum"] = -INTEROPERABLE_INT
        if _is_object(node) and not any(k in node for k in _OWN_RULE) and (
                visible or any(k in node for k in _OBJECT_HINTS)):
            props = dict(out.get("properties") or {})
            props.update({name: True for name in visible if name not in props})
            if props:
                out["properties"] = props
            out["additionalProperties"] = False
        return out
