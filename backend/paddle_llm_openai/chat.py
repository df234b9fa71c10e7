"""POST /v1/chat/completions: messages -> the model's chat template -> `llm` -> chat.completion(.chunk).

The prompt is rendered by chat_template.ChatRenderer (the model folder's own template, as the
engine's tokenizer applies it; `tools` go to the template unless tool_choice is "none"). With tools,
the model's output is parsed by the tool parser of its family (tools.tool_parser_for); "required" or
a named tool_choice forces a valid call through guided decoding (tools.guide_for). n sequences are n
`llm` requests (seeds seed + i). Streams: a first chunk per choice with the role, content (or
tool-call) deltas, a last chunk per choice with its finish_reason, the usage chunk when
stream_options.include_usage, then [DONE].
Thinking models (reasoning.py): `llm` returns the thinking apart from the answer; the message carries
it as `reasoning` and as the older `reasoning_content` (vLLM moved to the first; FastDeploy and many
clients read the second), streamed as `delta.reasoning` / `delta.reasoning_content`; content and
tool calls come from the answer only; usage.completion_tokens_details.reasoning_tokens counts it.
"""

from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from paddle_llm_openai import logprobs as lp
from paddle_llm_openai import params
from paddle_llm_openai import reasoning as reasoning_mod
from paddle_llm_openai.errors import bad_param, classify
from paddle_llm_openai.protocol import ChatCompletionRequest
from paddle_llm_openai.streaming import collect, open_stream, relay, sse
from paddle_llm_openai.tools import finish_reason as tools_finish
from paddle_llm_openai.triton_client import TritonError


def _render(fe, req: ChatCompletionRequest, template_kwargs: dict | None):
    """(prompt, tool parser or None, guided-decoding entries for the tools or None, tool choice).
    template_kwargs: chat_template_kwargs after the reasoning settings. 400s name the parameter
    (tools.ToolsError, chat_template.ChatTemplateError)."""
    from paddle_llm_openai import tools as tools_mod
    from paddle_llm_openai.chat_template import ChatTemplateError

    if not req.messages:
        raise bad_param("messages", "must not be empty")
    renderer = fe.renderer
    parser, guide = None, None
    try:
        tools, choice = tools_mod.check_tools(req.tools, req.tool_choice)
        if tools and choice != "none":
            parser = renderer.tool_parser
            guide = tools_mod.guide_for(tools, req.tool_choice, parser, req.parallel_tool_calls,
                                        params.response_format_schema(req.response_format) if choice == "auto" else None)
    except tools_mod.ToolsError as e:
        raise bad_param(e.param, e.message) from None
    try:
        prompt = renderer.render(req.messages, tools if parser is not None else None,
                                 bool(req.add_generation_prompt), template_kwargs)
    except ChatTemplateError as e:
        raise bad_param(e.param, e.message) from None
    return prompt, parser, guide, choice


async def create(fe, req: ChatCompletionRequest):
    """A dict (non-streamed) or an async iterator of SSE bytes whose first `llm` response has
    already arrived (an error it reports is answered with its own status)."""
    params.check_refused(req)
    lora = await fe.lora.resolve(req.model)  # a LoRA adapter's name, or None for the base model (404 neither)
    model = req.model
    n = params.check_n(req)
    rf_guide = params.response_format_guide(req.response_format)
    sp, names = params.sampling(req, chat=True, guide=rf_guide)
    params.add_lora(sp, names, lora)
    kwargs, split = reasoning_mod.apply(req, sp, names, req.chat_template_kwargs,
                                        fe.renderer.template_has_thinking_switch, fe.reasoning_parser)
    prompt, parser, tool_guide, choice = _render(fe, req, kwargs)
    if tool_guide and rf_guide and choice != "auto":  # "auto": the tools' grammar holds the format
        raise bad_param("response_format", "cannot be combined with a forced tool call (tool_choice)")
    if tool_guide:
        sp.update(tool_guide)
        names["sampling_parameters.structured_outputs"] = "tool_choice"
        names["sampling_parameters.guided_decoding"] = "tool_choice"
    seeds = params.seeds(req.seed, n)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    gens = [fe.llm.generate(prompt, dict(sp, seed=seeds[i]) if seeds[i] is not None else sp,
                            stream=bool(req.stream), logprobs=bool(req.logprobs), request_id=f"{rid}-{i}",
                            reasoning=split)
            for i in range(n)]
    k = req.top_logprobs or 0
    if req.stream:
        return await _stream(req, gens, parser, names, rid, created, model, k, split, choice)
    try:
        seqs = await collect(gens)
    except TritonError as e:
        raise classify(str(e), names) from None
    choices = []
    for i, s in enumerate(seqs):
        msg = {"role": "assistant", "content": s.text, "refusal": None}
        if split:  # both names: vLLM's current field and the older one FastDeploy and clients read
            msg["reasoning"] = msg["reasoning_content"] = s.reasoning or None
        finish = s.finish_reason
        if parser is not None:
            content, calls = parser.parse(s.text)
            msg["content"] = content
            if calls:
                msg["tool_calls"] = calls
            finish = tools_finish(choice, bool(calls), finish)
        choices.append({"index": i, "message": msg, "finish_reason": finish,
                        "logprobs": {"content": lp.chat_content(s.logprobs or [], k), "refusal": None}
                        if req.logprobs else None})
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": None, "choices": choices,
            "usage": params.usage(seqs[0].num_input_tokens, sum(s.num_output_tokens for s in seqs),
                                  sum(s.num_reasoning_tokens for s in seqs) if split else None,
                                  seqs[0].num_cached_tokens)}


class _ChatPieces:
    """Per piece of the merged stream, its chat.completion.chunk events: content (or tool-call deltas
    through the tool parser's stream state), logprobs, and the finish chunk ("tool_calls" when the
    sequence made a call). chunk(i, delta, finish=None, entries=None) -> bytes frames one event."""

    def __init__(self, n: int, parser, chunk, choice: str = "auto"):
        self.chunk = chunk
        self.choice = choice
        self.n_in, self.n_out, self.n_reasoning, self.n_cached = [0] * n, [0] * n, [0] * n, [0] * n
        self.states = [parser.stream() if parser is not None else None for _ in range(n)]
        self.called = [False] * n

    def __call__(self, i: int, piece) -> list[bytes]:
        self.n_in[i] = piece.num_input_tokens or self.n_in[i]
        self.n_cached[i] = piece.num_cached_tokens or self.n_cached[i]
        self.n_out[i] += piece.num_output_tokens
        self.n_reasoning[i] += piece.num_reasoning_tokens
        out, st = [], self.states[i]
        entries = piece.logprobs
        if piece.reasoning:  # the thinking first: it came before this piece's answer text
            out.append(self.chunk(i, {"reasoning": piece.reasoning, "reasoning_content": piece.reasoning},
                                  entries=None if piece.text else entries))
            if not piece.text:
                piece.logprobs = None  # carried by the reasoning chunk
        if st is None:
            if piece.text or piece.logprobs:
                out.append(self.chunk(i, {"content": piece.text}, entries=piece.logprobs))
        else:
            deltas = st.feed(piece.text) if piece.text else []
            if piece.finish_reason is not None:
                deltas = deltas + st.finish()
            for j, d in enumerate(deltas):
                self.called[i] = self.called[i] or bool(d.get("tool_calls"))
                out.append(self.chunk(i, d, entries=piece.logprobs if j == 0 else None))
            if not deltas and piece.logprobs:
                out.append(self.chunk(i, {}, entries=piece.logprobs))
        if piece.finish_reason is not None:
            out.append(self.chunk(i, {}, tools_finish(self.choice, self.called[i], piece.finish_reason)))
        return out


async def _stream(req, gens, parser, names, rid, created, model, k, split, choice="none") -> AsyncIterator[bytes]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    pieces, first = await open_stream(gens, names)
    n = len(gens)

    def chunk(i: int, delta: dict, finish=None, entries=None) -> bytes:
        c = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [{"index": i, "delta": delta, "finish_reason": finish,
                          "logprobs": {"content": lp.chat_content(entries, k), "refusal": None}
                          if (req.logprobs and entries) else None}]}
        if include_usage:
            c["usage"] = None
        return sse(c)

    handle = _ChatPieces(n, parser, chunk, choice)

    def usage():
        if not include_usage:
            return None
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "system_fingerprint": None, "choices": [],
                    "usage": params.usage(handle.n_in[0], sum(handle.n_out),
                                          sum(handle.n_reasoning) if split else None, handle.n_cached[0])})

    async def events():
        for i in range(n):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for event in relay(first, pieces, handle, names, usage):
            yield event

    return events()
