"""llguidance Lark grammars for tool calls in a model family's format (tool_parsers).

- forced_grammar(functions, parser, max_calls): "required" / a named tool: the output is one call
  (or, with max_calls None, one or more) of the given functions and nothing else.
- auto_grammar(functions, parser, max_calls, text_schema): "auto": free text (or JSON of text_schema,
  a response_format) until the format's call opening
  (`<tool_call>`; for Llama-3 JSON, an answer that opens with `{`), then every call is bound to its
  tool's schema, so a call the model starts always parses and validates. Text can never contain
  the opening tag outside a call (the parser would read it as a call).

Each call's arguments are `%json{<the tool's parameters>}` closed (paddle_llm_structured.closed_schema:
only the keys the schema names) with the bounded JSON whitespace of json_layout; `x-guidance` keys
the tool's schema sets itself win. functions: OpenAI function objects (`name`, `parameters`?).
Calls are separated by at most two spaces / newlines (Qwen writes one newline between blocks), or
`;` and a space for Llama-3 JSON.
"""

from __future__ import annotations

import json

from paddle_llm_openai.tool_parsers import ToolParser
from paddle_llm_structured.closed_schema import close_schema
from paddle_llm_structured.json_layout import json_options

NO_ARGS_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
# calls per answer when parallel calls are allowed: a small greedy model repeats the same call
# until max_tokens cuts the last one (SmolLM2-135M: five get_time calls, then cut at 150 tokens)
MAX_PARALLEL_CALLS = 4
_SEP = r"/[ \n]{0,2}/"
_UTF8 = "/(?s:.*)/"  # any text (valid UTF-8)


def arguments_schema(function: dict) -> dict:
    """The schema a call's arguments are generated under: the tool's `parameters` closed (no
    parameters: an empty object), with the default whitespace unless the schema sets its own."""
    return _json_schema(function.get("parameters") or NO_ARGS_SCHEMA)


def _json_schema(schema: dict) -> dict:
    """schema closed, with the default whitespace unless its own `x-guidance` says otherwise."""
    out = close_schema(schema)
    out["x-guidance"] = {**json_options(schema=schema), **(schema.get("x-guidance") or {})}
    return out


def call_rules(functions: list[dict], parser: ToolParser) -> list[str]:
    """Lark rules: `call` (one call of any of the functions: the opening tag, then `body`), `body`
    (the rest of a call), c<n> and a<n> (the rest of call n and its arguments)."""
    tag = parser.start_tag
    rules = [f"call: {_lit(tag)} body" if tag else "call: body",
             "body: " + " | ".join(f"c{n}" for n in range(len(functions)))]
    for n, f in enumerate(functions):
        pre, post = parser.grammar_prefix(f["name"])[len(tag):], parser.grammar_suffix()
        rules += [f"c{n}: {_lit(pre)} a{n} {_lit(post)}", f"a{n}: %json{json.dumps(arguments_schema(f))}"]
    return rules


def _calls(parser: ToolParser, max_calls: int) -> str:
    """One call, or up to max_calls joined by the format's separator (Llama-3 JSON: `;`)."""
    sep = _SEP if parser.start_tag else "/; ?/"
    return "call" if max_calls == 1 else f"call ({sep} call){{0,{max_calls - 1}}}"


def forced_grammar(functions: list[dict], parser: ToolParser, max_calls: int = 1) -> str:
    """The grammar of an answer that is only calls: one to max_calls of them."""
    return "\n".join([f"start: {_calls(parser, max_calls)}"] + call_rules(functions, parser)) + "\n"


def auto_grammar(functions: list[dict], parser: ToolParser, max_calls: int = MAX_PARALLEL_CALLS,
                 text_schema: dict | None = None) -> str:
    """The grammar of an answer that is text, or text then one to max_calls calls; after the calls
    the answer ends. text_schema: the answer is either JSON of this schema (closed, bounded
    whitespace; a response_format) or calls, without text before them."""
    if text_schema is not None:
        return "\n".join([f"start: answer | {_calls(parser, max_calls)}", f"answer: %json{json.dumps(_json_schema(text_schema))}"]
                         + call_rules(functions, parser)) + "\n"
    if parser.start_tag:
        # text is anything without the opening tag; the first tag ends the text and starts a call
        # (a lazy lexeme: the shortest text that ends with the tag, so a token spanning the text
        # and the tag, e.g. " <", is allowed)
        tag = _regex_escape(parser.start_tag)
        text = f"TEXT: {_UTF8} & ~/(?s:.*){tag}(?s:.*)/\nopening[lazy]: /(?s:.*){tag}/"
        more = "" if max_calls == 1 else f" ({_SEP} call){{0,{max_calls - 1}}}"
        start = f"start: TEXT | opening body{more}"
    else:
        # Llama-3 JSON: an answer that opens with `{` (after whitespace) is a call, other text is not
        text = f"TEXT: {_UTF8} & ~/[ \\t\\r\\n]*\\{{(?s:.*)/"
        start = f"start: TEXT | {_calls(parser, max_calls)}"
    return "\n".join([start, text] + call_rules(functions, parser)) + "\n"


def _lit(s: str) -> str:
    """A Lark string literal of s (JSON escapes; names and tags are ASCII)."""
    return json.dumps(s)


def _regex_escape(s: str) -> str:
    """s as a literal inside a Lark /regex/ (Rust regex syntax; `/` escaped for Lark)."""
    special = set("\\.+*?()|[]{}^$#&-~/")
    return "".join("\\" + c if c in special else c for c in s)
