"""The `llm` model's direct request, in the Triton vLLM backend's contract (the ensemble's engine
requests are the other kind: ensemble_steps.py).

VllmRequest.parse reads one Triton request into the prompt's token ids, the SamplingParams and the
ResponseOptions: text_input (required, non-empty), sampling_parameters JSON or else the request's
Triton parameters (contracts/vllm.py), the BOOL inputs stream, exclude_input_in_output and
return_* (a tensor, else a request parameter of that name), the serving default_max_tokens and the
client's timeout. It checks only what the contract adds to the engine's rules (a stream never
repeats the prompt); the engine's rules run once, in EngineLoop.submit (LLMEngine.check_request),
and VllmRequest.submit raises their InvalidRequestError under this contract's names
(sampling_parameters.<key>). ResponseOptions.response builds each Triton response with the vLLM
backend's output semantics: intermediate responses carry finish_reason "None" (str(None), as
vLLM's), logprob entries always carry "rank", `logprobs` is JSON null when return_logprobs is set
but the request asked for no `logprobs`, and decoded_token follows skip_special_tokens like
text_output does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import numpy as np

from paddle_llm_engine import EngineLoop, InvalidRequestError, SamplingParams
from paddle_llm_engine.outputs import RequestOutput
from paddle_llm_engine.tokenizer import check_prompt_bytes, encode_prompt
from paddle_llm_triton import tensors as T
from paddle_llm_triton.contracts.defaults import apply_default_max_tokens
from paddle_llm_triton.contracts.vllm import (check_stream_prompt, contract_error, from_request_parameters,
                                              from_vllm_json)
from paddle_llm_triton.llm.delta_buffer import Flush
from paddle_llm_triton.contracts.timeout import timeout_seconds


@dataclass(frozen=True)
class ResponseOptions:
    """What the client asked to get back (the vLLM backend's flag names).

    stream: one response per output with text (else one at the end); prompt_text: prepended to a
    non-streamed answer (exclude_input_in_output False), else None; return_*: the optional outputs;
    logprobs_null: return_logprobs without `logprobs` asked (JSON null, as vLLM);
    skip_special_tokens: how decoded_token renders special tokens (as text_output);
    return_reasoning: (an extension; the vLLM backend has no reasoning output) text_output carries
    the answer only, reasoning_output the thinking (the model's reasoning parser splits them; without
    one reasoning_output is "" and text_output the whole text), num_reasoning_tokens the sequence's
    tokens inside its thinking span (of this response when streaming, of the answer otherwise);
    return_num_cached_tokens: (an extension) num_cached_tokens, the prompt tokens found in the prefix
    cache when the request was first scheduled (OpenAI's usage.prompt_tokens_details.cached_tokens);
    n: the request's sequences (response_n: each per-sequence output has n entries)."""

    stream: bool = False
    prompt_text: str | None = None
    return_finish_reason: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    return_logprobs: bool = False
    logprobs_null: bool = False
    skip_special_tokens: bool = True
    return_cumulative_logprob: bool = False
    return_reasoning: bool = False
    return_num_cached_tokens: bool = False
    n: int = 1

    def response(self, flush: Flush, out: RequestOutput, decode_token: Callable[[int, bool], str]):
        """The pb_utils.InferenceResponse of one flush of text (delta_buffer.py) from output `out`;
        decode_token(id, skip_special_tokens) renders logprob entries. n > 1: see response_n."""
        return self.response_n({out.sequence_index: (flush, out)}, decode_token)

    def response_n(self, parts: dict[int, tuple[Flush, RequestOutput]], decode_token: Callable[[int, bool], str]):
        """One response for the flushes of some of the request's n sequences, in the vLLM backend's
        form: every per-sequence output is an array of n entries, entry i for sequence i (text_output
        [n], finish_reason [n], num_output_tokens [n], cumulative_logprob [n], logprobs [n], and the
        reasoning outputs); a sequence without a flush in this response has "" text, 0 tokens and
        "None" as finish reason (a stream sends each sequence's deltas as they come; a non-streamed
        request gets all n at the end). num_input_tokens / num_cached_tokens stay [1]."""
        import triton_python_backend_utils as pb_utils

        n = self.n
        rows = [parts.get(i) for i in range(n)]
        any_out = next(o for _, o in parts.values())

        def arr(values, dtype):
            return np.array(values, dtype=dtype)

        def text_of(part):
            if part is None:
                return ""
            flush = part[0]
            return flush.content if self.return_reasoning and flush.content is not None else flush.text

        tensors = [pb_utils.Tensor("text_output", arr([text_of(r).encode("utf-8") for r in rows], np.object_))]
        if self.return_reasoning:
            tensors.append(pb_utils.Tensor("reasoning_output", arr(
                [((r[0].reasoning or "") if r else "").encode("utf-8") for r in rows], np.object_)))
            tensors.append(pb_utils.Tensor("num_reasoning_tokens", arr(
                [(r[0].reasoning_tokens if self.stream else r[0].num_reasoning_tokens) if r else 0 for r in rows],
                np.uint32)))
        if self.return_finish_reason:  # vLLM: str(None) until the sequence ends
            tensors.append(pb_utils.Tensor("finish_reason", arr(
                [(r[1].finish_reason if r and r[1].sequence_finished else "None").encode() for r in rows], np.object_)))
        if self.return_num_input_tokens:
            tensors.append(pb_utils.Tensor("num_input_tokens", arr([any_out.num_prompt_tokens], np.uint32)))
        if self.return_num_cached_tokens:
            tensors.append(pb_utils.Tensor("num_cached_tokens", arr([any_out.num_cached_tokens], np.uint32)))
        if self.return_num_output_tokens:
            tensors.append(pb_utils.Tensor("num_output_tokens", arr(
                [(len(r[0].ids) if self.stream else r[1].num_output_tokens) if r else 0 for r in rows], np.uint32)))
        if self.return_cumulative_logprob:
            tensors.append(pb_utils.Tensor("cumulative_logprob", arr(
                [r[1].cumulative_logprob if r else 0.0 for r in rows], np.float32)))
        if self.return_logprobs:
            tensors.append(pb_utils.Tensor("logprobs", arr(
                [b"null" if self.logprobs_null else json.dumps(self.logprob_entries(r[0], decode_token) if r else [])
                 .encode() for r in rows], np.object_)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def logprob_entries(self, flush: Flush, decode_token: Callable[[int, bool], str]) -> list[dict]:
        """Per token {token id: {"logprob", "rank", "decoded_token"}}: the sampled token first, with its
        rank in the vocabulary (the sampler's), then the top alternatives ranked 1..logprobs."""
        skip = self.skip_special_tokens
        entries = []
        for tok, (lp, top) in zip(flush.ids, flush.logprobs):
            mine = {"logprob": lp, "rank": getattr(top, "rank", None), "decoded_token": decode_token(tok, skip)}
            d = {str(tok): mine}
            for rank, (alt, alp) in enumerate(top, 1):
                if alt == tok:
                    if mine["rank"] is None:
                        mine["rank"] = rank
                    continue
                d[str(alt)] = {"logprob": alp, "rank": rank, "decoded_token": decode_token(alt, skip)}
            entries.append(d)
        return entries


@dataclass
class VllmRequest:
    """One direct request: prompt_ids (token ids of text_input), params (not yet checked: the
    engine checks them once), options (ResponseOptions), timeout_s (the client's, or None)."""

    prompt_ids: list[int]
    params: SamplingParams
    options: ResponseOptions
    timeout_s: float | None = None

    @classmethod
    def parse(cls, request, tokenizer, max_model_len: int, default_max_tokens: int) -> "VllmRequest":
        """Read a pb_utils.InferenceRequest. default_max_tokens: the `llm` parameter (0: the
        engine's default, max_model_len - prompt). Raises InvalidRequestError naming the input."""
        text = T.get_str(request, "text_input")
        if not text:
            raise InvalidRequestError("text_input", "required and must not be empty")
        check_prompt_bytes(tokenizer, text, max_model_len, field="text_input")
        prompt_ids = encode_prompt(tokenizer, text)
        # sampling parameters: the sampling_parameters tensor, else the request's Triton parameters
        # (the vLLM backend's rule: with the tensor, request parameters are not read)
        sp_text = T.get_str(request, "sampling_parameters")
        params, pflags = (from_vllm_json(sp_text), {}) if sp_text is not None else \
            from_request_parameters(request.parameters())

        def flag(name: str) -> bool | None:
            """A BOOL input: the tensor, else a request parameter of that name (gRPC clients)."""
            v = T.get_bool(request, name)
            return pflags.get(name) if v is None else v

        apply_default_max_tokens(params, len(params.truncated_prompt(prompt_ids, max_model_len)), max_model_len,
                                 default_max_tokens)
        stream = bool(flag("stream"))
        # The prompt text is prepended to a non-streamed answer unless exclude_input_in_output is
        # True (the vLLM backend's semantics); a stream never repeats it, and a client that asks
        # for it while streaming gets an error, as from the vLLM backend.
        exclude = flag("exclude_input_in_output")
        check_stream_prompt(stream, exclude)
        want_lp, want_cum = bool(flag("return_logprobs")), bool(flag("return_cumulative_logprob"))
        params.compute_logprobs = want_lp or want_cum  # values are computed only when an output carries them
        options = ResponseOptions(
            stream=stream, prompt_text=text if not stream and not exclude else None,
            return_finish_reason=bool(flag("return_finish_reason")),
            return_num_input_tokens=bool(flag("return_num_input_tokens")),
            return_num_output_tokens=bool(flag("return_num_output_tokens")),
            return_logprobs=want_lp, logprobs_null=want_lp and params.logprobs is None,
            skip_special_tokens=params.skip_special_tokens, return_cumulative_logprob=want_cum,
            return_reasoning=bool(flag("return_reasoning")),
            return_num_cached_tokens=bool(flag("return_num_cached_tokens")), n=params.n)
        return cls(prompt_ids, params, options, timeout_seconds(request))

    def submit(self, loop: EngineLoop, request_id: str, on_output: Callable[[RequestOutput], None]) -> None:
        """Submit to the engine (outputs to on_output on the engine thread). Raises as
        EngineLoop.submit, with an InvalidRequestError's field in this contract's names."""
        try:
            loop.submit(request_id, self.prompt_ids, self.params, on_output, timeout_s=self.timeout_s)
        except InvalidRequestError as e:
            raise contract_error(e) from None
