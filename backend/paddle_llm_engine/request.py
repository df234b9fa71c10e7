"""Request intake: the one place a request is checked, on the caller's thread, before it is queued.

check_request(prompt_ids, params) -> PreparedRequest runs every rule of the engine once (the
prompt's length and token ids, SamplingParams.validate, the max_tokens rule, a guide that must
compile) and raises InvalidRequestError naming the field at once; EngineLoop.submit calls it before
anything is queued, so an adapter answers a bad request synchronously and only renames the field
into its contract's words. What it derives (the truncated prompt, max_tokens and EOS ids resolved,
the bad words as token ids, one compiled guide per sequence) travels in the PreparedRequest, and
the params in it are a frozen copy: nothing changes them afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError
from paddle_llm_engine.guided import GuidedDecoding
from paddle_llm_engine.reasoning import EngineReasoning, ReasoningParser
from paddle_llm_engine.sampling_params import SamplingParams, check_lengths, check_prompt_length


@dataclass(frozen=True)
class PreparedRequest:
    """A request the engine accepted.

    prompt_token_ids: the prompt as the engine runs it (truncate_prompt_tokens applied); params:
    a frozen copy of the request's SamplingParams; max_tokens: resolved (max_model_len - prompt
    when the request sent none); eos_token_ids: the request's end ids, else the model's;
    bad_words_ids: params.bad_words tokenized plus params.bad_words_ids; guides: one compiled
    guided.GuideState per sequence (params.n of them) when params.guide is set, else ();
    reasoning: the request's bound reasoning parser, or None (no thinking span); thinks_at_start:
    whether its output starts inside the thinking span (ReasoningParser.thinks_at_start); lora: the
    LoRA adapter params.lora_name names, as loaded when the request was accepted (None: the base)."""

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    max_tokens: int
    eos_token_ids: tuple[int, ...]
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    guides: tuple = ()
    reasoning: ReasoningParser | None = None
    thinks_at_start: bool = False
    lora: object | None = None  # the lora.LoraAdapter of params.lora_name, resolved at intake


class RequestChecker:
    """The engine's request rules, callable from any thread (it reads only settings, the tokenizer
    and the guide compiler, which is thread-safe).

    max_model_len / vocab_size: the engine's limits; tokenizer: encodes bad words; eos_token_ids:
    the model's default end ids; guided: the engine's GuidedDecoding; reasoning: the engine's
    EngineReasoning (None: no request has a thinking span); loras: the engine's lora.LoraRegistry
    (None: LoRA is off, a lora_name is refused)."""

    def __init__(self, max_model_len: int, vocab_size: int, tokenizer, eos_token_ids: list[int],
                 guided: GuidedDecoding, reasoning: EngineReasoning | None = None, loras=None):
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.guided = guided
        self.reasoning = reasoning
        self.loras = loras

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> PreparedRequest:
        """The PreparedRequest of a prompt (token ids) and its params. Raises InvalidRequestError
        naming the field, with its ErrorCode: prompt (PROMPT_EMPTY, PROMPT_TOO_LONG),
        prompt_token_ids (TOKEN_OUT_OF_VOCABULARY), max_tokens (MAX_TOKENS_TOO_LARGE), a
        SamplingParams field (INVALID_SAMPLING_PARAM), the guide's field when it does not compile
        (INVALID_GUIDE), reasoning_parser (unknown, or unusable with this tokenizer) and
        reasoning_max_tokens (a budget without a reasoning parser) (INVALID_REASONING), lora_name (an
        adapter not loaded, or LoRA off) (INVALID_LORA)."""
        if len(prompt_token_ids) == 0:
            raise InvalidRequestError("prompt", "the prompt is empty (0 tokens)", ErrorCode.PROMPT_EMPTY)
        ids = [int(t) for t in params.truncated_prompt(list(prompt_token_ids), self.max_model_len)]
        check_prompt_length(len(ids), self.max_model_len)
        vocab = self.vocab_size
        bad = [t for t in (min(ids), max(ids)) if not 0 <= t < vocab]
        if bad:  # the embedding lookup would fail the whole step, and with it every request in flight
            raise InvalidRequestError("prompt_token_ids", f"token id {bad[0]} outside the vocabulary [0, {vocab})",
                                      ErrorCode.TOKEN_OUT_OF_VOCABULARY)
        params.validate(vocab)
        lora = None
        if params.lora_name is not None:
            if self.loras is None:
                raise InvalidRequestError("lora_name", f"this model serves no LoRA adapters (enable_lora is 0), got "
                                                       f"{params.lora_name!r}", ErrorCode.INVALID_LORA)
            lora = self.loras.get(params.lora_name)
        max_tokens = check_lengths(len(ids), params.max_tokens, self.max_model_len)
        eos = tuple(params.eos_token_ids) if params.eos_token_ids is not None else self.eos_token_ids
        frozen = params.frozen()
        bad_words = tuple(tuple(int(t) for t in self.tokenizer.encode(w, add_special_tokens=False))
                          for w in frozen.bad_words) + tuple(tuple(w) for w in frozen.bad_words_ids)
        guides = ()
        if frozen.guide is not None:  # compile errors name the guide's field; the first masks start now
            stop_ids = sorted(set(frozen.stop_token_ids) | (set() if frozen.ignore_eos else set(eos)))
            guides = tuple(self.guided.new_state(frozen.guide, stop_ids) for _ in range(frozen.n))
        parser, at_start = None, False
        if self.reasoning is not None:
            parser = self.reasoning.for_request(frozen.reasoning_parser)
        elif frozen.reasoning_parser not in (None, "none"):
            raise InvalidRequestError("reasoning_parser", "this engine has no reasoning parsers",
                                      ErrorCode.INVALID_REASONING)
        if parser is not None:
            at_start = parser.thinks_at_start(ids)
        elif frozen.reasoning_max_tokens is not None:
            raise InvalidRequestError("reasoning_max_tokens", "the model has no thinking span to budget (its "
                                                              "reasoning parser is off: reasoning_parser none)",
                                      ErrorCode.INVALID_REASONING)
        return PreparedRequest(tuple(ids), frozen, max_tokens, eos, bad_words, guides, parser, at_start, lora)
