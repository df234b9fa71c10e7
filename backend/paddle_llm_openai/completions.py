"""POST /v1/completions: prompts -> `llm` requests -> an OpenAI text_completion (or its SSE chunks).

A prompt is a string or a list of strings (token-id prompts are refused: `llm` takes text). Each
prompt gets n sequences (one `llm` request each, seeds seed + i); choice index = prompt * n + i.
echo: the prompt text starts the choice (sent by this frontend, so streams can echo too; logprobs
with echo are refused: prompt logprobs are not computed). usage: prompt tokens counted once per
prompt (llm's num_input_tokens), completion tokens summed over the choices.
"""

from __future__ import annotations

import time
import uuid
from typing import AsyncIterator

from paddle_llm_openai import logprobs as lp
from paddle_llm_openai import params
from paddle_llm_openai.errors import bad_param, classify
from paddle_llm_openai.protocol import CompletionRequest
from paddle_llm_openai.streaming import collect, open_stream, relay, sse
from paddle_llm_openai.triton_client import TritonError


def _prompts(prompt) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if not prompt:
        raise bad_param("prompt", "must not be empty")
    raise bad_param("prompt", "token-id prompts are not supported: send text (llm takes text_input)")


async def create(fe, req: CompletionRequest):
    """A dict (non-streamed) or an async iterator of SSE bytes whose first event is already computed
    (so that an error the first `llm` response reports is answered with its own status)."""
    params.check_refused(req)
    lora = await fe.lora.resolve(req.model)  # a LoRA adapter's name, or None for the base model (404 neither)
    model = req.model
    n = params.check_n(req)
    prompts = _prompts(req.prompt)
    sp, names = params.sampling(req, chat=False, guide=params.response_format_guide(req.response_format))
    params.add_lora(sp, names, lora)
    seeds = params.seeds(req.seed, n)
    rid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    want_lp = req.logprobs is not None
    gens = []
    for p in prompts:
        for i in range(n):
            spi = dict(sp, seed=seeds[i]) if seeds[i] is not None else sp
            gens.append(fe.llm.generate(p, spi, stream=bool(req.stream), logprobs=want_lp,
                                        request_id=f"{rid}-{len(gens)}"))
    if req.stream:
        return await _stream(req, gens, prompts, n, names, rid, created, model)
    try:
        seqs = await collect(gens)
    except TritonError as e:
        raise classify(str(e), names) from None
    choices = []
    for k, s in enumerate(seqs):
        text = (prompts[k // n] if req.echo else "") + s.text
        choices.append({"index": k, "text": text, "finish_reason": s.finish_reason,
                        "logprobs": lp.completion(s.logprobs or [], req.logprobs) if want_lp else None})
    prompt_tokens = sum(seqs[p * n].num_input_tokens for p in range(len(prompts)))
    cached = sum(seqs[p * n].num_cached_tokens for p in range(len(prompts)))
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": None, "choices": choices,
            "usage": params.usage(prompt_tokens, sum(s.num_output_tokens for s in seqs), cached_tokens=cached)}


async def _stream(req, gens, prompts, n, names, rid, created, model) -> AsyncIterator[bytes]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    want_lp = req.logprobs is not None
    pieces, first = await open_stream(gens, names)

    def chunk(k: int, text: str, finish, entries, offset) -> bytes:
        c = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": None,
             "choices": [{"index": k, "text": text, "finish_reason": finish,
                          "logprobs": lp.completion(entries or [], req.logprobs, offset) if want_lp else None}]}
        if include_usage:
            c["usage"] = None
        return sse(c)

    n_in, n_out, n_cached = [0] * len(gens), [0] * len(gens), [0] * len(gens)
    offsets, echoed = [0] * len(gens), [False] * len(gens)

    def handle(k: int, piece) -> list[bytes]:
        prefix = ""
        if req.echo and not echoed[k]:
            prefix, echoed[k] = prompts[k // n], True
        n_in[k] = piece.num_input_tokens or n_in[k]
        n_cached[k] = piece.num_cached_tokens or n_cached[k]
        n_out[k] += piece.num_output_tokens
        offsets[k] += len(prefix)
        out = []
        if prefix or piece.text or piece.finish_reason or piece.logprobs:
            out.append(chunk(k, prefix + piece.text, piece.finish_reason, piece.logprobs, offsets[k]))
        offsets[k] += len(piece.text)
        return out

    def usage():
        if not include_usage:
            return None
        prompt_tokens = sum(n_in[p * n] for p in range(len(prompts)))
        cached = sum(n_cached[p * n] for p in range(len(prompts)))
        return sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                    "system_fingerprint": None, "choices": [],
                    "usage": params.usage(prompt_tokens, sum(n_out), cached_tokens=cached)})

    return relay(first, pieces, handle, names, usage)
