"""Tool calling for /v1/chat/completions: check `tools` / `tool_choice`, pick the model family's
tool-call parser, and build the guided-decoding grammar that forces a valid call.

- `check_tools(tools, tool_choice) -> (tools, choice)`: the request's tools (OpenAI `{"type":
  "function", "function": {"name", "description"?, "parameters"?, "strict"?}}`) and its choice, one
  of "none" / "auto" / "required" or a tool name (from `{"type": "function", "function": {"name"}}`);
  default "auto" with tools, "none" without. Raises ToolsError(param, message) -> HTTP 400 naming
  the parameter (`tools[1].function.name`, `tool_choice`, ...).
- `tool_parser_for(model_type, chat_template=None) -> ToolParser` (config.json's model_type).
- `guide_for(tools, tool_choice, parser) -> dict | None`: for "required" / a named tool, the
  `sampling_parameters` entries of model `llm` (`{"structured_outputs": {"grammar": <Lark>}}`, see
  paddle_llm_triton/contracts/guided.py) whose grammar is exactly one call in the parser's format, the
  arguments constrained by llguidance's `%json{...}` to the tool's `parameters` schema (compact JSON,
  no free whitespace, so a small model cannot wander); None for "auto" / "none". Validates first.
- `parse_tool_calls(tool_choice)`: whether the output is parsed for calls (not with "none").
"""

from __future__ import annotations

import json
import re

from paddle_llm_openai.tool_parsers import (ErnieToolParser, HermesToolParser, Llama3JsonToolParser,
                                            QwenToolParser, ToolParser)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = ("none", "auto", "required")
GUIDE_KEY = "structured_outputs"
NO_ARGS_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}

PARSERS: dict[str, type[ToolParser]] = {
    "qwen2": QwenToolParser, "qwen2_moe": QwenToolParser, "qwen3": QwenToolParser,
    "qwen3_moe": QwenToolParser, "ernie4_5": ErnieToolParser, "ernie4_5_moe": ErnieToolParser,
    "llama": HermesToolParser,
}


class ToolsError(ValueError):
    """A bad `tools` / `tool_choice` value: HTTP 400 with `param` named."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = self.msg = message


def tool_parser_for(model_type: str, chat_template: str | None = None) -> ToolParser:
    """The tool-call parser of a model family (config.json's model_type).

    qwen2 / qwen3 and their MoE: Qwen (`<tool_call>` JSON); ernie4_5 / ernie4_5_moe: ERNIE (the same
    blocks, `<response>` markers dropped); llama: Llama-3 JSON (`{"name", "parameters"}`) when the
    chat template is a Llama 3.1+ tool template (mentions `<|python_tag|>`, or `tools` and
    "parameters" without `<tool_call>`), else Hermes `<tool_call>` JSON: the ChatML convention, and what
    ChatRenderer describes to a model whose template ignores `tools` (SmolLM2). Any other
    model_type: Hermes."""
    cls = PARSERS.get(model_type, HermesToolParser)
    if model_type == "llama" and chat_template and "<tool_call>" not in chat_template and (
            "<|python_tag|>" in chat_template or ("tools" in chat_template and "parameters" in chat_template)):
        cls = Llama3JsonToolParser
    return cls()


def check_tools(tools, tool_choice) -> tuple[list[dict] | None, str]:
    """(tools or None, choice): choice is "none" / "auto" / "required" or the forced tool's name.
    Raises ToolsError naming the parameter."""
    if tools is not None:
        if not isinstance(tools, list):
            raise ToolsError("tools", f"expected a list of tools, got {type(tools).__name__}")
        seen = set()
        for k, t in enumerate(tools):
            p = f"tools[{k}]"
            if not isinstance(t, dict):
                raise ToolsError(p, "expected an object")
            if t.get("type", "function") != "function":
                raise ToolsError(f"{p}.type", f"only \"function\" tools are supported, got {t.get('type')!r}")
            f = t.get("function")
            if not isinstance(f, dict):
                raise ToolsError(f"{p}.function", "required: an object with a name")
            name = f.get("name")
            if not isinstance(name, str) or not _NAME.match(name):
                raise ToolsError(f"{p}.function.name", f"must be 1-64 letters, digits, _ or -, got {name!r}")
            if name in seen:
                raise ToolsError(f"{p}.function.name", f"duplicate tool name {name!r}")
            seen.add(name)
            params = f.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise ToolsError(f"{p}.function.parameters", "must be a JSON schema object")
            if f.get("description") is not None and not isinstance(f["description"], str):
                raise ToolsError(f"{p}.function.description", "must be a string")
        if not tools:
            tools = None
    if tool_choice is None:
        return tools, "auto" if tools else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise ToolsError("tool_choice", f"must be one of {', '.join(CHOICES)} or a named function, "
                                            f"got {tool_choice!r}")
        if tool_choice == "required" and not tools:
            raise ToolsError("tool_choice", "\"required\" needs `tools`")
        return tools, tool_choice
    if isinstance(tool_choice, dict):
        f = tool_choice.get("function")
        if tool_choice.get("type", "function") != "function" or not isinstance(f, dict):
            raise ToolsError("tool_choice", "a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}")
        name = f.get("name")
        names = [t["function"]["name"] for t in tools or ()]
        if name not in names:
            raise ToolsError("tool_choice.function.name",
                             f"{name!r} is not one of the request's tools ({', '.join(names) or 'none given'})")
        return tools, name
    raise ToolsError("tool_choice", f"expected a string or an object, got {type(tool_choice).__name__}")


def parse_tool_calls(tool_choice) -> bool:
    """Whether an output is parsed for tool calls: not when the choice is "none" (or no tools)."""
    return tool_choice != "none"


def guide_for(tools, tool_choice, parser: ToolParser) -> dict | None:
    """`sampling_parameters` entries forcing one valid call ("required": any of the tools; a name:
    that tool), or None ("auto" / "none"). Validates tools / tool_choice (ToolsError); a parameters
    schema llguidance cannot compile is a ToolsError naming `tools[k].function.parameters`."""
    tools, choice = check_tools(tools, tool_choice)
    if choice in ("none", "auto"):
        return None
    chosen = [(k, t["function"]) for k, t in enumerate(tools)
              if choice == "required" or t["function"]["name"] == choice]
    rules = []
    for n, (k, f) in enumerate(chosen):
        rule = _lark_rules(n, f, parser)
        _check_grammar(f"tools[{k}].function.parameters", "\n".join([f"start: c{n}"] + rule))
        rules.append(rule)
    lines = ["start: " + " | ".join(f"c{n}" for n in range(len(rules)))]
    for r in rules:
        lines += r
    return {GUIDE_KEY: {"grammar": "\n".join(lines) + "\n"}}


def _lark_rules(n: int, f: dict, parser: ToolParser) -> list[str]:
    """Lark rules c<n> (the whole call) and a<n> (its arguments) for function f."""
    schema = f.get("parameters")
    schema = dict(schema) if schema else dict(NO_ARGS_SCHEMA)
    schema["x-guidance"] = {**schema.get("x-guidance", {}), "whitespace_flexible": False}
    pre, post = parser.grammar_prefix(f["name"]), parser.grammar_suffix()
    return [f"c{n}: {_lit(pre)} a{n} {_lit(post)}", f"a{n}: %json{json.dumps(schema)}"]


def _lit(s: str) -> str:
    """A Lark string literal of s (JSON escapes; names and tags are ASCII)."""
    return json.dumps(s)


def _check_grammar(param: str, grammar: str) -> None:
    import llguidance

    try:
        err = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("grammar", grammar))
    except Exception as e:  # noqa: BLE001 - llguidance's conversion errors
        err = str(e)
    if err:
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        raise ToolsError(param, "invalid JSON schema for guided decoding: " + lines[0])
