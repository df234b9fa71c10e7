"""The OpenAI frontend's tool calling without a server: the tool-call parsers on hand-written model
outputs (whole, and streamed split at every point and character by character, so a tag, a name or
a JSON string cut across deltas still parses to the same calls), the OpenAI delta shapes, tools /
tool_choice checks, the guided-decoding grammar (run through llguidance with the SmolLM2 tokenizer:
the right call is accepted, a wrong one is not) and the chat template rendering (SmolLM2's template
and a Qwen-like template that reads `tools`). About 15 s (most of it loading paddleformers for the
engine-side rendering)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

try:
    import paddle_llm_openai  # noqa: F401
except ImportError:  # the editable install predates the package: import it from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backend"))

from paddle_llm_openai.chat_template import ChatRenderer, ChatTemplateError
from paddle_llm_openai.tool_parsers import (ErnieToolParser, HermesToolParser, Llama3JsonToolParser,
                                            QwenToolParser)
from paddle_llm_openai.tools import ToolsError, check_tools, guide_for, parse_tool_calls, tool_parser_for

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now"}}

# (parser, model output, expected content, expected [(name, arguments as a Python value)])
TAGGED = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
     None, [("get_weather", {"city": "Paris", "days": 3})]),
    ('Let me check.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "To}kyo \\"x\\" {", '
     '"days": [1, {"a": "]"}]}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n',
     "Let me check.", [("get_weather", {"city": 'To}kyo "x" {', "days": [1, {"a": "]"}]}), ("now", {})]),
    ('<tool_call>{"arguments": {"q": "é"}, "name": "search"}</tool_call>', None, [("search", {"q": "é"})]),
    ('<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>', None, [("f", {"a": 1})]),
    ("The answer is 4. Tags like <tool and <b> stay.  ", "The answer is 4. Tags like <tool and <b> stay.  ", []),
    ("<tool_call>{not json}</tool_call> after", "<tool_call>{not json}</tool_call> after", []),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}', None,
     [("get_weather", {"city": "Paris", "days": 2})]),  # no end tag: the output stopped at EOS
]
LLAMA = [
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 1}}', None,
     [("get_weather", {"city": "Paris", "days": 1})]),
    ('<|python_tag|>{"name": "now", "parameters": {}}; {"name": "f", "arguments": {"x": "};"}}', None,
     [("now", {}), ("f", {"x": "};"})]),
    ("  It is sunny {\"name\": 1}", "  It is sunny {\"name\": 1}", []),
    ("<|python", "<|python", []),
]
ERNIE = [
    ('<response>Checking.</response>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>', "Checking.",
     [("now", {})]),
    ("<response>Just text.</response>", "Just text.", []),
]
CASES = ([(QwenToolParser(), *c) for c in TAGGED] + [(HermesToolParser(), *c) for c in TAGGED[:2]]
         + [(ErnieToolParser(), *c) for c in TAGGED[:3] + ERNIE] + [(Llama3JsonToolParser(), *c) for c in LLAMA])
IDS = [f"{p.name}-{k}" for k, (p, *_rest) in enumerate(CASES)]


def simple(calls: list[dict]) -> list[tuple[str, object]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def assemble(deltas: list[dict]) -> tuple[str | None, list[dict]]:
    """Join OpenAI chat deltas as a client does, checking their shapes on the way."""
    content, calls = "", []
    for d in deltas:
        assert set(d) in ({"content"}, {"tool_calls"}), d
        if "content" in d:
            assert isinstance(d["content"], str) and d["content"]
            content += d["content"]
            continue
        (tc,) = d["tool_calls"]
        if tc["index"] == len(calls):  # a new call: id, type and name first, empty arguments
            assert tc["id"].startswith("call_") and len(tc["id"]) == 29 and tc["type"] == "function", tc
            assert tc["function"]["arguments"] == "" and tc["function"]["name"]
            calls.append({"id": tc["id"], "function": dict(tc["function"])})
        else:
            assert tc["index"] == len(calls) - 1 and set(tc) == {"index", "function"}, tc
            assert set(tc["function"]) == {"arguments"} and tc["function"]["arguments"], tc
            calls[-1]["function"]["arguments"] += tc["function"]["arguments"]
    return content or None, calls


def run_stream(parser, pieces: list[str]) -> list[dict]:
    st = parser.stream()
    out = []
    for p in pieces:
        out += st.feed(p)
    return out + st.finish()


@pytest.mark.parametrize("parser, text, content, expected", CASES, ids=IDS)
def test_parse_whole(parser, text, content, expected):
    got_content, calls = parser.parse(text)
    assert got_content == content
    assert simple(calls) == expected
    assert len({c["id"] for c in calls}) == len(calls)
    assert all(c["type"] == "function" for c in calls)


@pytest.mark.parametrize("parser, text, content, expected", CASES, ids=IDS)
def test_stream_split_everywhere(parser, text, content, expected):
    """Two deltas cut at every position, then one character per delta: same content and calls."""
    splits = [[text[:k], text[k:]] for k in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        got_content, calls = assemble(run_stream(parser, pieces))
        assert got_content == content, pieces
        assert simple(calls) == expected, pieces


@pytest.mark.parametrize("parser, text, content, expected", CASES, ids=IDS)
def test_stream_never_leaks_markup(parser, text, content, expected):
    """Content deltas never carry a piece of a call (tags, JSON) when the output has calls."""
    if not expected:
        return
    for k in range(len(text) + 1):
        for d in run_stream(parser, [text[:k], text[k:]]):
            if "content" in d:
                assert "<tool" not in d["content"] and "{" not in d["content"], (k, d)


def test_arguments_stream_as_generated():
    """The name goes out as soon as its string closes; arguments before the call is complete."""
    st = QwenToolParser().stream()
    assert st.feed('<tool_call>\n{"name": "get_wea') == []
    name, args = st.feed('ther", "arguments": {"ci')
    assert name["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert args == {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}
    (d,) = st.feed('ty": "Pa')
    assert d["tool_calls"][0]["function"]["arguments"] == 'ty": "Pa'
    assert st.feed('ris"}}\n</tool_')[0]["tool_calls"][0]["function"]["arguments"] == 'ris"}'
    assert st.feed("call>") == [] and st.finish() == []


def test_content_streams_before_a_call():
    st = QwenToolParser().stream()
    assert st.feed("Hello wor") == [{"content": "Hello wor"}]
    assert st.feed("ld  <tool") == [{"content": "ld"}]  # trailing spaces / a partial tag held
    assert st.feed("_call>") == []
    assert st.finish() == [{"content": "<tool_call>"}]  # an empty call is no call: its text stays content


@pytest.mark.slow
@pytest.mark.parametrize("parser", [QwenToolParser(), Llama3JsonToolParser()], ids=lambda p: p.name)
def test_long_arguments_stream_in_linear_time(parser):
    """Arguments of ~10 000 and ~42 000 characters in 4-character deltas: each delta scans only its own
    text, so 4x the text takes ~4x the time; a parser that rescans the call at every delta is quadratic
    (16x). Judged on the ratio of the two sizes, best of 3 each, so a loaded host slows both alike."""
    import time

    def seconds(items: int) -> float:
        args = json.dumps({"items": [{"k": i, "v": "x{[\\\"" * 3} for i in range(items)]})
        text = parser.call_text("f", args)
        deltas = [text[k:k + 4] for k in range(0, len(text), 4)]
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            content, calls = assemble(run_stream(parser, deltas))
            best = min(best, time.perf_counter() - t0)
            assert content is None and calls[0]["function"]["arguments"] == args
        return best

    small, large = seconds(250), seconds(1000)
    assert large / small < 8.0, f"4x the arguments took {large / small:.1f}x the time ({small:.3f} s -> {large:.3f} s)"


def test_truncated_call_keeps_what_was_streamed():
    """finish_reason "length" mid-arguments: the call and the arguments so far (not valid JSON)."""
    content, calls = QwenToolParser().parse('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert content is None and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Par'}


def test_tool_parser_for_model_types():
    assert [tool_parser_for(m).name for m in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")] == ["qwen"] * 4
    assert [tool_parser_for(m).name for m in ("ernie4_5", "ernie4_5_moe")] == ["ernie"] * 2
    assert tool_parser_for("llama").name == "hermes"  # SmolLM2: a ChatML template without tools
    llama31 = "{%- if tools %}...{{- '<|python_tag|>' }}... \"parameters\": ...{% endif %}"
    assert tool_parser_for("llama", llama31).name == "llama3_json"
    assert tool_parser_for("llama", "{% if tools %}<tool_call>{% endif %}").name == "hermes"
    assert tool_parser_for("mistral").name == "hermes"


@pytest.mark.parametrize("tools, choice, param", [
    ("x", "auto", "tools"),
    ([{"type": "retrieval"}], "auto", "tools[0].type"),
    ([{"type": "function"}], "auto", "tools[0].function"),
    ([{"type": "function", "function": {"name": "a b"}}], "auto", "tools[0].function.name"),
    ([WEATHER, WEATHER], "auto", "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": [1]}}], "auto", "tools[0].function.parameters"),
    ([WEATHER], "sometimes", "tool_choice"),
    (None, "required", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "now"}}, "tool_choice.function.name"),
    ([WEATHER], {"type": "function"}, "tool_choice"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "dependentSchemas": {}}}}],
     "required", "tools[0].function.parameters"),
])
def test_tools_errors_name_the_parameter(tools, choice, param):
    with pytest.raises(ToolsError) as e:
        guide_for(tools, choice, QwenToolParser())
    assert e.value.param == param, e.value


def test_check_tools_defaults():
    assert check_tools(None, None) == (None, "none")
    assert check_tools([WEATHER], None) == ([WEATHER], "auto")
    assert check_tools([], "auto") == (None, "auto")
    assert check_tools([WEATHER, NOW], {"type": "function", "function": {"name": "now"}})[1] == "now"
    assert "grammar" in guide_for([WEATHER], "auto", QwenToolParser())["structured_outputs"]  # lazy: see below
    assert guide_for([WEATHER], "none", QwenToolParser()) is None
    assert not parse_tool_calls("none") and parse_tool_calls("auto") and parse_tool_calls("get_weather")


@pytest.fixture(scope="module")
def ll_tokenizer(smollm2_dir):
    import llguidance

    return llguidance.LLTokenizer(Path(smollm2_dir, "tokenizer.json").read_text(), eos_token=2)


def accepts(ll_tokenizer, guide: dict, text: str) -> bool:
    """Whether the guide's grammar (as model `llm` compiles it) accepts exactly `text`."""
    import llguidance

    m = llguidance.LLMatcher(ll_tokenizer, llguidance.grammar_from("grammar", guide["structured_outputs"]["grammar"]),
                             log_level=0)
    ids = ll_tokenizer.tokenize_str(text)
    return m.consume_tokens(ids) and not m.is_error() and m.is_accepting()


@pytest.mark.parametrize("parser", [QwenToolParser(), ErnieToolParser(), Llama3JsonToolParser()], ids=lambda p: p.name)
def test_guide_forces_a_valid_call(parser, ll_tokenizer):
    """The forced-call grammar accepts the format's compact call text (which the parser reads back)
    and rejects another tool's name, arguments outside the schema and free whitespace."""
    named = guide_for([WEATHER, NOW], {"type": "function", "function": {"name": "get_weather"}}, parser)
    required = guide_for([WEATHER, NOW], "required", parser)
    good = parser.call_text("get_weather", '{"city":"Tokyo","days":7}')
    assert simple(parser.parse(good)[1]) == [("get_weather", {"city": "Tokyo", "days": 7})]
    assert accepts(ll_tokenizer, named, good) and accepts(ll_tokenizer, required, good)
    assert accepts(ll_tokenizer, required, parser.call_text("now", "{}"))
    assert not accepts(ll_tokenizer, named, parser.call_text("now", "{}"))
    assert not accepts(ll_tokenizer, named, parser.call_text("get_weather", '{"city":"Rome","days":7}'))
    assert not accepts(ll_tokenizer, named, parser.call_text("get_weather", '{"city":"Tokyo","days":8}'))
    assert accepts(ll_tokenizer, named, parser.call_text("get_weather", '{"city": "Tokyo", "days": 7}'))
    assert not accepts(ll_tokenizer, named, parser.call_text("get_weather", '{"city":  "Tokyo", "days": 7}'))
    assert not accepts(ll_tokenizer, named, parser.call_text("get_weather", '{\n\n"city": "Tokyo", "days": 7}'))
    two = parser.call_text("now", "{}") + ("; " if parser.name == "llama3_json" else "\n") + good
    assert not accepts(ll_tokenizer, required, two) and not accepts(ll_tokenizer, named, two)  # one forced call


OPEN = {"type": "function", "function": {"name": "find", "parameters": {  # says nothing of other keys
    "type": "object", "properties": {"q": {"type": "string"}, "opts": {"type": "object", "properties": {
        "n": {"type": "integer"}}}}, "required": ["q"]}}}


@pytest.mark.parametrize("parser", [QwenToolParser(), Llama3JsonToolParser()], ids=lambda p: p.name)
def test_tool_arguments_are_closed(parser, ll_tokenizer):
    """A tool's parameters allow no key they do not name, nested objects too, in every choice mode."""
    for choice in ("required", {"type": "function", "function": {"name": "find"}}, "auto"):
        g = guide_for([OPEN], choice, parser)
        assert accepts(ll_tokenizer, g, parser.call_text("find", '{"q": "x", "opts": {"n": 1}}'))
        assert not accepts(ll_tokenizer, g, parser.call_text("find", '{"q": "x", "extra": 1}'))
        assert not accepts(ll_tokenizer, g, parser.call_text("find", '{"q": "x", "opts": {"n": 1, "m": 2}}'))


def test_auto_grammar_is_text_or_valid_calls(ll_tokenizer):
    """"auto": any text without the call tag; once the tag is written the call is bound to its tool's
    schema; calls come after the text, at most MAX_PARALLEL_CALLS (one without parallel calls)."""
    from paddle_llm_openai.tool_grammar import MAX_PARALLEL_CALLS

    p = HermesToolParser()
    g = guide_for([WEATHER, NOW], "auto", p)
    call = p.call_text("get_weather", '{"city": "Paris", "days": 2}')
    for text in ("", "Paris is sunny <b>today</b> {\"json\": 1}", call, "Let me check. " + call,
                 "Sure:\n" + call + "\n" + p.call_text("now", "{}")):
        assert accepts(ll_tokenizer, g, text), text
    for text in ("I use <tool_call> in prose", "x " + p.call_text("get_weather", '{"city": "Rome", "days": 2}'),
                 p.call_text("get_weather", '{"city": "Paris", "days": 2, "hour": 3}'), call + " and more text",
                 "\n".join([call] * (MAX_PARALLEL_CALLS + 1))):
        assert not accepts(ll_tokenizer, g, text), text
    assert accepts(ll_tokenizer, g, "\n".join([call] * MAX_PARALLEL_CALLS))
    one = guide_for([WEATHER, NOW], "auto", p, parallel_tool_calls=False)
    assert accepts(ll_tokenizer, one, "ok " + call) and not accepts(ll_tokenizer, one, call + "\n" + call)
    fmt = guide_for([WEATHER], "auto", p, text_schema={"type": "object", "properties": {"a": {"type": "integer"}}})
    assert accepts(ll_tokenizer, fmt, '{"a": 1}') and accepts(ll_tokenizer, fmt, call)
    assert not accepts(ll_tokenizer, fmt, "text") and not accepts(ll_tokenizer, fmt, '{"a": 1, "b": 2}')
    llama = Llama3JsonToolParser()
    g = guide_for([WEATHER], "auto", llama)
    assert accepts(ll_tokenizer, g, "It is sunny.") and accepts(ll_tokenizer, g, llama.call_text("get_weather",
                                                                                               '{"city": "Paris", "days": 1}'))
    assert not accepts(ll_tokenizer, g, ' {"city": "Paris"}')  # an answer opening with `{` is a call


def test_finish_reason_tool_calls_only_when_the_model_chose():
    from paddle_llm_openai.tools import finish_reason

    assert finish_reason("auto", True, "stop") == "tool_calls"
    assert finish_reason("auto", False, "stop") == "stop" and finish_reason("auto", True, "length") == "length"
    assert finish_reason("required", True, "stop") == "stop" and finish_reason("get_weather", True, "stop") == "stop"


def test_bad_parallel_tool_calls_and_response_format_name_the_parameter():
    with pytest.raises(ToolsError) as e:
        guide_for([WEATHER], "auto", QwenToolParser(), parallel_tool_calls="yes")
    assert e.value.param == "parallel_tool_calls"
    with pytest.raises(ToolsError) as e:
        guide_for([WEATHER], "auto", QwenToolParser(), text_schema={"type": "object", "dependentSchemas": {}})
    assert e.value.param == "response_format"


# --- chat templates ---

@pytest.fixture(scope="module")
def smol(smollm2_dir):
    return ChatRenderer(smollm2_dir)


def test_smollm2_template(smol, smollm2_tokenizer):
    """The engine's own rendering (paddleformers) of the same messages, and text parts joined."""
    assert smol.model_type == "llama" and not smol.template_has_tools and smol.tool_parser.name == "hermes"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": [{"type": "text", "text": "2+2?"}, {"type": "text", "text": "Quick."}]}]
    want = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello<|im_end|>\n<|im_start|>user\n2+2?\nQuick.<|im_end|>\n<|im_start|>assistant\n")
    assert smol.render(msgs, None, True, None) == want
    engine_msgs = msgs[:3] + [{"role": "user", "content": "2+2?\nQuick."}]
    assert smollm2_tokenizer.apply_chat_template(engine_msgs, add_generation_prompt=True, tokenize=False) == want
    assert smol.render(msgs, None, False, None) == want[:-len("<|im_start|>assistant\n")]
    assert smol.render([{"role": "user", "content": "x"}]).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert smol.render([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                       None, False, None) == want[:want.index("<|im_start|>assistant")]


def test_smollm2_tools_folded_into_the_prompt(smol):
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = smol.render(msgs, [WEATHER], True, None)
    assert text.startswith("<|im_start|>system\n# Tools\n") and json.dumps(WEATHER) in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}'
            "\n</tool_call><|im_end|>") in text
    assert "<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text
    assert "SmolLM" not in text  # our system message replaced the template's default one


@pytest.mark.parametrize("messages, needle", [
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
     "messages[0].content[0]: image_url parts are not supported"),
    ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0]: expected a text part"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([], "non-empty list"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
])
def test_bad_messages(smol, messages, needle):
    with pytest.raises(ChatTemplateError) as e:
        smol.render(messages, None, True, None)
    assert e.value.param == "messages" and needle in e.value.message


def test_reserved_template_kwargs(smol):
    with pytest.raises(ChatTemplateError) as e:
        smol.render([{"role": "user", "content": "x"}], None, True, {"tokenize": True})
    assert e.value.param == "chat_template_kwargs"


QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "</tools><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{%- for tc in m.tool_calls %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not "
    "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{%- endif %}"
    "{%- if messages[0].role == 'tool' %}{{ raise_exception('a tool message cannot come first') }}{% endif %}")


@pytest.fixture(scope="module")
def qwen_like(smollm2_dir, tmp_path_factory):
    """A model folder with the SmolLM2 tokenizer and a Qwen-like template that reads `tools`."""
    d = tmp_path_factory.mktemp("qwen_like")
    shutil.copy(Path(smollm2_dir, "tokenizer.json"), d)
    cfg = json.loads(Path(smollm2_dir, "tokenizer_config.json").read_text())
    cfg["chat_template"] = QWEN_LIKE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return ChatRenderer(str(d))


def test_template_with_tools(qwen_like):
    assert qwen_like.template_has_tools and qwen_like.tool_parser.name == "qwen"
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    text = qwen_like.render(msgs, [NOW], True, {"enable_thinking": False})
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>" + json.dumps(NOW) + "</tools>")
    assert '<tool_call>\n{"name": "now", "arguments": {"tz": "UTC"}}\n</tool_call>' in text  # an object, tojson'd
    assert text.endswith("<|im_start|>tool\n12:00<|im_end|><|im_start|>assistant\n<think>\n\n</think>\n\n")
    with pytest.raises(ChatTemplateError) as e:
        qwen_like.render([{"role": "tool", "content": "x"}], None, True, None)
    assert e.value.param == "messages" and "a tool message cannot come first" in e.value.message


def test_no_chat_template(smollm2_dir, tmp_path):
    shutil.copy(Path(smollm2_dir, "tokenizer.json"), tmp_path)
    cfg = json.loads(Path(smollm2_dir, "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ChatTemplateError) as e:
        ChatRenderer(str(tmp_path)).render([{"role": "user", "content": "x"}])
    assert e.value.param == "messages" and "no chat template" in e.value.message
