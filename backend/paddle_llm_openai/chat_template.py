"""Chat messages -> the prompt text, through the model folder's own chat template.

`ChatRenderer(model_dir)` loads the folder's tokenizer with transformers' AutoTokenizer (tokenizer.json
+ tokenizer_config.json, offline; no Paddle) once, and `render(messages, tools, add_generation_prompt,
extra)` returns `apply_chat_template(..., tokenize=False)`: the same Jinja template the engine applies
through paddleformers (paddle_llm_engine/tokenizer.py). The text then goes to `llm` as `text_input`.

Messages (OpenAI chat format): roles system / developer / user / assistant / tool; content a string,
None (an assistant message that only calls tools) or a list of text parts (`{"type": "text", "text"}`,
joined with "\\n" as vLLM does). Image / audio / file parts -> ChatTemplateError (text-only models).

Tools: when the template uses `tools` (Qwen, Llama 3.1, ERNIE-4.5 Thinking), they are passed to it, and
assistant `tool_calls` get their `arguments` as objects (what templates `tojson`). When it does not
(the default SmolLM2-135M-Instruct: plain ChatML), the tools are described in the system message in
the tool parser's format, assistant tool calls are written as that format's text, and tool results
are `tool` turns with `<tool_response>` ... `</tool_response>` content, so the model still sees them.

Errors: ChatTemplateError(param, message) -> HTTP 400 naming the parameter (`messages`,
`chat_template_kwargs`): bad message shapes, image parts, a template that raises (e.g. roles that do
not alternate), a model folder without a chat template.
"""

from __future__ import annotations

import copy
import json
import os

from paddle_llm_openai.tool_parsers import ToolParser

ROLES = ("system", "developer", "user", "assistant", "tool")
_RESERVED = ("conversation", "messages", "tools", "documents", "tokenize", "add_generation_prompt",
             "return_dict", "chat_template", "continue_final_message")


class ChatTemplateError(ValueError):
    """Messages the template cannot render: HTTP 400 naming `param`."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = self.msg = message


class ChatRenderer:
    """The model folder's chat template (see the module docstring).

    model_dir: the folder with tokenizer.json / tokenizer_config.json / config.json.
    Attributes: model_type (config.json, "" when absent), chat_template (the template text or None),
    template_has_tools (the template reads `tools`), template_has_thinking_switch (it reads
    `enable_thinking`, as Qwen3's), tool_parser (tools.tool_parser_for)."""

    def __init__(self, model_dir: str):
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        from paddle_llm_openai.tools import tool_parser_for

        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tpl = getattr(self.tokenizer, "chat_template", None)
        if isinstance(tpl, dict):  # several named templates: the default one
            tpl = tpl.get("default") or next(iter(tpl.values()), None)
        self.chat_template: str | None = tpl
        self.template_has_tools = bool(tpl) and "tools" in tpl
        self.template_has_thinking_switch = bool(tpl) and "enable_thinking" in tpl
        try:
            with open(os.path.join(model_dir, "config.json")) as f:
                self.model_type = json.load(f).get("model_type", "")
        except (OSError, json.JSONDecodeError):
            self.model_type = ""
        self.tool_parser: ToolParser = tool_parser_for(self.model_type, tpl)

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               add_generation_prompt: bool = True, extra: dict | None = None) -> str:
        """The prompt text of `messages` (OpenAI chat messages) with `tools` (OpenAI tool objects or
        None); `extra`: chat_template_kwargs passed to the template (e.g. enable_thinking).
        Raises ChatTemplateError."""
        if not self.chat_template:
            raise ChatTemplateError("messages", f"the model ({os.path.basename(self.model_dir.rstrip('/'))}) has "
                                                "no chat template (tokenizer_config.json chat_template); use "
                                                "/v1/completions")
        msgs = normalize_messages(messages)
        if tools and not self.template_has_tools:
            msgs = fold_tools(msgs, tools, self.tool_parser)
            tools = None
        elif tools:
            msgs = _arguments_as_objects(msgs)
        kwargs = dict(extra or {})
        for k in kwargs:
            if k in _RESERVED:
                raise ChatTemplateError("chat_template_kwargs", f"{k!r} cannot be set here")
        try:
            text = self.tokenizer.apply_chat_template(msgs, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception as e:  # noqa: BLE001 - Jinja's TemplateError, raise_exception(), type errors
            raise ChatTemplateError("messages", f"the chat template cannot render these messages: "
                                                f"{type(e).__name__}: {e}") from None
        if not isinstance(text, str):
            raise ChatTemplateError("messages", "the chat template did not produce text")
        return text


def normalize_messages(messages) -> list[dict]:
    """Checked copies of OpenAI chat messages with text content as one string (parts joined by
    "\\n"), None content of a tool-calling assistant as "", role developer as system. Raises
    ChatTemplateError("messages")."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError("messages", f"messages[{i}]: expected an object")
        role = m.get("role")
        if role not in ROLES:
            raise ChatTemplateError("messages", f"messages[{i}].role: expected one of {', '.join(ROLES)}, "
                                                f"got {role!r}")
        m = {k: v for k, v in m.items() if v is not None or k == "content"}
        m["content"] = _text_content(i, m.get("content"), role)
        if role == "developer":  # OpenAI's newer name for system; templates know "system"
            m["role"] = "system"
        out.append(m)
    return out


def _text_content(i: int, content, role: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError("messages", f"messages[{i}].content: expected a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "file"):
            raise ChatTemplateError("messages", f"messages[{i}].content[{j}]: {kind} parts are not supported "
                                                "(the model is text only); send text parts")
        else:
            raise ChatTemplateError("messages", f"messages[{i}].content[{j}]: expected a text part "
                                                "{\"type\": \"text\", \"text\": ...}, got " + repr(part)[:80])
    return "\n".join(texts)


def _arguments_as_objects(msgs: list[dict]) -> list[dict]:
    """Assistant tool_calls with `function.arguments` parsed from JSON text (templates `tojson` them)."""
    out = []
    for m in msgs:
        if m.get("tool_calls"):
            m = copy.deepcopy(m)
            for tc in m["tool_calls"]:
                fn = tc.get("function", {}) if isinstance(tc, dict) else {}
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass
        out.append(m)
    return out


def tools_system_text(tools: list[dict], parser: ToolParser) -> str:
    """The description of `tools` and of the call format, for a template without tool support."""
    sigs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    example = parser.call_text("<function-name>", "<arguments-json-object>").replace('"<function-name>"',
                                                                                      "<function-name>")
    return ("# Tools\n\nYou can call functions to help with the user's request. Their signatures, one JSON "
            f"object per line, are between <tools> and </tools>:\n<tools>\n{sigs}\n</tools>\n\nTo call a "
            f"function, answer with its name and a JSON object of arguments in this form:\n{example}")


def fold_tools(msgs: list[dict], tools: list[dict], parser: ToolParser) -> list[dict]:
    """Messages for a template that ignores `tools`: the tool description appended to the system
    message (or a new one first), assistant tool calls as the format's text, tool results wrapped
    in <tool_response>."""
    desc = tools_system_text(tools, parser)
    msgs = [dict(m) for m in msgs]
    if msgs[0]["role"] in ("system", "developer"):
        msgs[0]["content"] = (msgs[0]["content"] + "\n\n" + desc) if msgs[0]["content"] else desc
    else:
        msgs.insert(0, {"role": "system", "content": desc})
    for m in msgs:
        calls = m.pop("tool_calls", None)
        if m["role"] == "assistant" and calls:
            texts = [parser.call_text(tc["function"]["name"], tc["function"].get("arguments") or "{}")
                     for tc in calls if isinstance(tc, dict) and isinstance(tc.get("function"), dict)]
            m["content"] = "\n".join(([m["content"]] if m["content"] else []) + texts)
        elif m["role"] == "tool":
            m["content"] = f"<tool_response>\n{m['content']}\n</tool_response>"
    return msgs
