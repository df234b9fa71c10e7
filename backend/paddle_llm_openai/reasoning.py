"""Thinking models on /v1/chat/completions: reasoning_effort, the thinking budget's two names, and
which reasoning parser `llm` is asked to use.

`llm` splits the output (its engine tracks the thinking span token by token, so streamed deltas are
exact and nothing is parsed twice): this frontend sends `return_reasoning` and reads
`reasoning_output` / `num_reasoning_tokens`; `message.content` is then the answer only, and tool
calls are parsed from it alone.

reasoning_effort (OpenAI's values) maps to:
  none     thinking off: `enable_thinking: false` to the chat template when the template reads
           enable_thinking (Qwen3); otherwise a thinking budget of 0 (the engine ends the thinking at
           once: the model writes only the end marker).
  minimal  a thinking budget of 256 tokens
  low      1024
  medium   4096
  high     no budget (the model thinks as long as it wants; max_tokens still bounds the whole output)
The value is also passed to the chat template as `reasoning_effort` (templates that read it, e.g.
gpt-oss's, use it; others ignore it). An explicit budget in the body (reasoning_max_tokens /
thinking_token_budget) and an explicit chat_template_kwargs.enable_thinking win over the effort.
A budget on a model whose `llm` has no reasoning parser is a 400 naming the parameter it came from.

--reasoning-parser (cli.py): "auto" (the default: `llm`'s own setting, config.pbtxt
reasoning_parser), "none" (no split: the raw text in content; `llm` is told so per request, so its
engine does not wait for a thinking span either) or a family name (qwen3, ernie45, deepseek_r1),
sent per request as sampling_parameters.reasoning_parser.
"""

from __future__ import annotations

from paddle_llm_openai.errors import bad_param

EFFORT_BUDGETS = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": None}
PARSER_SETTINGS = ("auto", "none", "qwen3", "ernie45", "deepseek_r1")


def check_parser_setting(value: str) -> str:
    """The --reasoning-parser value, lower-cased; ValueError naming the option otherwise."""
    v = (value or "").strip().lower()
    if v not in PARSER_SETTINGS:
        raise ValueError(f"--reasoning-parser must be one of {', '.join(PARSER_SETTINGS)}, got {value!r}")
    return v


def budget(req) -> tuple[int | None, str | None]:
    """(the body's thinking budget, the parameter it came from) from reasoning_max_tokens /
    thinking_token_budget; (None, None) without one. 400 when both are given and differ."""
    a, b = getattr(req, "reasoning_max_tokens", None), getattr(req, "thinking_token_budget", None)
    if a is not None and b is not None and a != b:
        raise bad_param("reasoning_max_tokens", f"reasoning_max_tokens ({a}) and thinking_token_budget ({b}) are one "
                                                "budget under two names; both given with different values")
    if a is not None:
        return a, "reasoning_max_tokens"
    if b is not None:
        return b, "thinking_token_budget"
    return None, None


def apply(req, sp: dict, names: dict, template_kwargs: dict | None, template_has_switch: bool,
          parser_setting: str) -> tuple[dict | None, bool]:
    """Fold reasoning_effort and the parser setting into `sp` (sampling_parameters, which already
    holds the body's budget: params.sampling) and `names` (error renames); returns (the chat
    template kwargs to use, whether to ask `llm` for the split). template_has_switch: the chat
    template reads enable_thinking. 400 naming reasoning_effort for an unknown value."""
    kwargs = dict(template_kwargs or {})
    effort = getattr(req, "reasoning_effort", None)
    if effort is not None:
        if effort not in EFFORT_BUDGETS:
            raise bad_param("reasoning_effort", f"must be one of {', '.join(EFFORT_BUDGETS)}, got {effort!r}")
        kwargs.setdefault("reasoning_effort", effort)
        if effort == "none" and template_has_switch:
            kwargs.setdefault("enable_thinking", False)
        elif "reasoning_max_tokens" not in sp and EFFORT_BUDGETS[effort] is not None:
            sp["reasoning_max_tokens"] = EFFORT_BUDGETS[effort]
            names["sampling_parameters.reasoning_max_tokens"] = "reasoning_effort"
    if parser_setting != "auto":
        sp["reasoning_parser"] = parser_setting
        names["sampling_parameters.reasoning_parser"] = "reasoning_parser"
    return (kwargs or None), parser_setting != "none"
