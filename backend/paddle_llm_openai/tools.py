"""Tool calling for /v1/chat/completions: check `tools` / `tool_choice`, pick the model family's
tool-call parser, and build the guided-decoding grammar that keeps every call valid.

- `check_tools(tools, tool_choice) -> (tools, choice)`: the request's tools (OpenAI `{"type":
  "function", "function": {"name", "description"?, "parameters"?, "strict"?}}`) and its choice, one
  of "none" / "auto" / "required" or a tool name (from `{"type": "function", "function": {"name"}}`);
  default "auto" with tools, "none" without. Raises ToolsError(param, message) -> HTTP 400 naming
  the parameter (`tools[1].function.name`, `tool_choice`, ...).
- `tool_parser_for(model_type, chat_template=None) -> ToolParser` (config.json's model_type).
- `guide_for(tools, tool_choice, parser, parallel_tool_calls=None, text_schema=None) -> dict | None`:
  the `sampling_parameters` entries of model `llm` (`{"structured_outputs": {"grammar": <Lark>}}`,
  see paddle_llm_triton/contracts/guided.py; grammars in tool_grammar.py): "required" / a named
  tool: exactly one call (of that tool / of any tool); "auto": free text (or, with text_schema, the
  response_format's JSON) until the format's call tag, then calls bound to their tools' schemas
  (at most tool_grammar.MAX_PARALLEL_CALLS, one when parallel_tool_calls is false); None for "none". Arguments are closed schemas with bounded whitespace. Validates first.
- `parse_tool_calls(tool_choice)`: whether the output is parsed for calls (not with "none").
- `finish_reason(choice, called, reason)`: "tool_calls" only when the model chose to call ("auto")
  and the answer ended normally; a forced call ends with "stop", as OpenAI and vLLM answer.
"""

from __future__ import annotations

import re

from paddle_llm_openai import tool_grammar
from paddle_llm_openai.tool_parsers import (ErnieToolParser, HermesToolParser, Llama3JsonToolParser,
                                            QwenToolParser, ToolParser)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
CHOICES = ("none", "auto", "required")
GUIDE_KEY = "structured_outputs"
NO_ARGS_SCHEMA = tool_grammar.NO_ARGS_SCHEMA

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


def finish_reason(choice: str, called: bool, reason: str | None) -> str | None:
    """The answer's finish_reason: "tool_calls" when the model chose to call (choice "auto") and
    stopped by itself; otherwise the engine's reason ("stop" for a forced call, as OpenAI / vLLM)."""
    return "tool_calls" if called and choice == "auto" and reason == "stop" else reason


def guide_for(tools, tool_choice, parser: ToolParser, parallel_tool_calls: bool | None = None,
              text_schema: dict | None = None) -> dict | None:
    """`sampling_parameters` entries guiding the answer (see the module docstring), or None ("none").
    text_schema: "auto" only: a JSON schema the non-call answer must follow (response_format).
    Validates tools / tool_choice (ToolsError); a parameters schema llguidance cannot compile is a
    ToolsError naming `tools[k].function.parameters`."""
    tools, choice = check_tools(tools, tool_choice)
    if choice == "none":
        return None
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ToolsError("parallel_tool_calls", f"expected a boolean, got {parallel_tool_calls!r}")
    chosen = [(k, t["function"]) for k, t in enumerate(tools)
              if choice in ("required", "auto") or t["function"]["name"] == choice]
    for k, f in chosen:  # each tool alone first, so that an error names its parameters
        _check_grammar(f"tools[{k}].function.parameters", tool_grammar.forced_grammar([f], parser))
    functions = [f for _, f in chosen]
    many = tool_grammar.MAX_PARALLEL_CALLS if parallel_tool_calls is not False else 1
    if choice == "auto":
        grammar = tool_grammar.auto_grammar(functions, parser, many, text_schema)
        if text_schema is not None:
            _check_grammar("response_format", grammar)
    else:
        # one forced call: after a call it did not choose, a small model repeats it (SmolLM2 under
        # "required" with room for more: the same call again until max_tokens 80 cut it)
        grammar = tool_grammar.forced_grammar(functions, parser, 1)
    return {GUIDE_KEY: {"grammar": grammar}}


def _check_grammar(param: str, grammar: str) -> None:
    import llguidance

    try:
        err = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("grammar", grammar))
    except Exception as e:  # noqa: BLE001 - llguidance's conversion errors
        err = str(e)
    if err:
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        raise ToolsError(param, "invalid JSON schema for guided decoding: " + lines[0])
