"""Per-request sampling and stopping parameters, validated on arrival (LLMEngine.check_request),
and the length rules every entry point shares (check_prompt_length, check_lengths)."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError
from paddle_llm_engine.guided import GuideSpec


MAX_SEQUENCES = 64  # bound of SamplingParams.n
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


def check_prompt_length(num_prompt_tokens: int, max_model_len: int) -> None:
    """The prompt alone must leave room for one generated token. Raises InvalidRequestError naming
    the prompt (PROMPT_TOO_LONG) with the prompt's length and the limit."""
    n, limit = num_prompt_tokens, max_model_len
    if n > limit:
        raise InvalidRequestError("prompt", f"the prompt has {n} tokens, more than max_model_len {limit} "
                                            f"(at most {limit - 1} prompt tokens, to leave room for output)",
                                  ErrorCode.PROMPT_TOO_LONG)
    if n == limit:
        raise InvalidRequestError("prompt", f"the prompt has {n} tokens, as many as max_model_len {limit}, "
                                            f"which leaves no room for output (at most {limit - 1})",
                                  ErrorCode.PROMPT_TOO_LONG)


def check_lengths(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """The resolved max_tokens of a prompt of num_prompt_tokens (after truncation): max_tokens, or
    max_model_len - prompt when None. Raises InvalidRequestError naming the prompt when it
    leaves no room for output (check_prompt_length), max_tokens (MAX_TOKENS_TOO_LARGE) when prompt +
    max_tokens exceeds max_model_len."""
    check_prompt_length(num_prompt_tokens, max_model_len)
    resolved = max_tokens if max_tokens is not None else max_model_len - num_prompt_tokens
    if num_prompt_tokens + resolved > max_model_len:
        raise InvalidRequestError("max_tokens", f"prompt ({num_prompt_tokens} tokens) + max_tokens ({resolved}) "
                                                f"exceeds max_model_len ({max_model_len})",
                                  ErrorCode.MAX_TOKENS_TOO_LARGE)
    return resolved


def _bad_param(field: str, message: str) -> InvalidRequestError:
    """The error of a SamplingParams field out of its range (INVALID_SAMPLING_PARAM)."""
    return InvalidRequestError(field, message, ErrorCode.INVALID_SAMPLING_PARAM)


@dataclass
class SamplingParams:
    """How one request samples and when it stops. All values are per request.

    A caller builds and may change its SamplingParams until it submits them; the engine keeps a
    frozen copy of what it accepted (frozen(); setting a field of it raises
    dataclasses.FrozenInstanceError), and what the engine derives from them (the bad words'
    token ids, the bias arrays, each sequence's generator) lives in the request's state.

    temperature: >= 0; 0 means greedy (argmax). Default 1.0.
    top_k: 0 (or -1) disables; otherwise keep the k most likely tokens.
    top_p: in (0, 1]; nucleus sampling keeps the smallest set with cumulative prob >= top_p.
    seed: None draws a fresh seed; otherwise the request's own RNG is seeded with it, so the
        sampled text does not depend on the other requests in the batch.
    max_tokens: None means "until EOS or max_model_len" (resolved by the engine); else >= 1.
    n: sequences generated from the prompt, 1..MAX_SEQUENCES (TensorRT-LLM's num_return_sequences);
        they share the prompt's KV blocks, and sequence i samples with the seed seed + i.
    min_tokens: EOS / stop ids are suppressed until this many tokens exist.
    stop_token_ids: extra ids that end generation (finish_reason "stop").
    eos_token_ids: None means the model's generation_config EOS ids.
    ignore_eos: keep generating past EOS.
    stop: stop strings matched on the generated text; the match is not returned.
    min_p: in [0, 1]; drop tokens whose probability is below min_p * (top probability).
    repetition_penalty: > 0; 1 disables. Seen tokens (prompt and output) get logit / p when the
        logit is positive, logit * p otherwise (Keskar et al. 2019, CTRL; as HF).
    presence_penalty, frequency_penalty: in [-2, 2]; logit -= presence * [count > 0] +
        frequency * count over output tokens (OpenAI API definition).
    bad_words: words that must not be generated; tokenized by the engine (as given, no added
        space). A word's last token is masked whenever the sequence so far (prompt and output)
        ends with its other tokens; a one-token word is always masked (TensorRT-LLM / HF
        NoBadWordsLogitsProcessor semantics).
    bad_words_ids: bad words given as token ids (same rule), in addition to bad_words.
    logprobs: None, or 0..20 alternatives to report with each token's log-probability.
    compute_logprobs: compute the chosen token's logprob (and the cumulative one) even when
        logprobs is None; otherwise they are reported as 0.0 without the per-row log-softmax.
    guide: None, or a GuideSpec (guided decoding: JSON schema, regex, choice, grammar; see
        guided.py); the engine compiles it per sequence and a bad guide is an InvalidRequestError.
    include_stop_str_in_output: a matched stop string is returned (the text ends with it) instead
        of being cut off.
    spaces_between_special_tokens: passed to the tokenizer's decode (slow tokenizers put a space
        around special tokens when it is true; fast ones ignore it, as in vLLM). Matters only with
        skip_special_tokens false.
    logit_bias: {token id: bias} added to the logits before any other processing (vLLM / OpenAI).
    allowed_token_ids: None, or the only token ids that may be generated (others are masked first).
    truncate_prompt_tokens: None, k >= 1 (keep the prompt's last k tokens) or -1 (keep the last
        max_model_len - 1, so one token can still be generated); applied by LLMEngine.check_request.
    reasoning_max_tokens: None (no budget) or N >= 0: a thinking model may choose at most N tokens
        inside its thinking span; then the engine emits the family's end sequence (e.g. "\n</think>\n\n")
        and the answer follows (FastDeploy's reasoning_max_tokens, vLLM's thinking_token_budget).
        Needs a reasoning parser (reasoning/registry.py); 0 ends the thinking at once.
    reasoning_parser: None (the engine's setting), "none" (no thinking span: the output is all answer
        for the engine) or a parser name (reasoning/registry.py PARSERS).
    priority: scheduling priority, an int in [-2^31, 2^31); a lower value is served first (vLLM's
        order; default 0). Acts only under the engine's scheduling_policy "priority" (scheduler.py);
        not a sampling parameter, carried here so that every contract passes it the same way.
    lora_name: None (the base model) or the name of a loaded LoRA adapter (lora/, the engine's
        lora_modules setting or LLMEngine.add_lora) the request runs with; carried here as the vLLM
        backend carries it in sampling_parameters. An unknown name is refused (lora_name).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    max_tokens: int | None = None
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    compute_logprobs: bool = False
    bad_words: list[str] = field(default_factory=list)
    bad_words_ids: list[list[int]] = field(default_factory=list)
    guide: GuideSpec | None = None
    include_stop_str_in_output: bool = False
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] = field(default_factory=dict)
    allowed_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    reasoning_max_tokens: int | None = None
    reasoning_parser: str | None = None
    priority: int = 0
    lora_name: str | None = None

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"cannot set {name}: these SamplingParams belong to a request the engine accepted "
                f"(change a copy: dataclasses.replace)")
        object.__setattr__(self, name, value)

    def frozen(self) -> "SamplingParams":
        """A deep copy that can no longer change (the engine's copy of an accepted request's
        params); dataclasses.replace of it gives a new, changeable one."""
        c = copy.deepcopy(self)
        c.__dict__["_frozen"] = True
        return c

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self, vocab_size: int) -> None:
        """The engine's rules, which are also the vLLM-backend contract's (the Triton adapter's
        TensorRT-LLM contract states where it differs). Raises InvalidRequestError naming the first
        bad field; token ids must be in [0, vocab_size); every float must be finite (inf and NaN
        pass some range checks, e.g. inf >= 0, and would reach the sampler)."""
        for name in FLOAT_FIELDS:
            v = getattr(self, name)
            if not math.isfinite(v):
                raise _bad_param(name, f"must be a finite number, got {v}")
        if not (self.temperature >= 0.0):
            raise _bad_param("temperature", f"must be >= 0, got {self.temperature}")
        if self.top_k < -1:
            raise _bad_param("top_k", f"must be -1, 0 (disabled) or >= 1, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise _bad_param("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise _bad_param("max_tokens", f"must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise _bad_param("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _bad_param("min_tokens", f"({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) \
                or not -2**31 <= self.priority < 2**31:
            raise _bad_param("priority", f"must be an integer in [-2^31, 2^31), got {self.priority!r}")
        if self.seed is not None and not (0 <= self.seed < 2**64):
            raise _bad_param("seed", f"must be in [0, 2^64), got {self.seed}")
        if not (1 <= self.n <= MAX_SEQUENCES):
            raise _bad_param("n", f"must be in [1, {MAX_SEQUENCES}], got {self.n}")
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("eos_token_ids", self.eos_token_ids or [])):
            for t in ids:
                if not (0 <= t < vocab_size):
                    raise _bad_param(name, f"token id {t} outside the vocabulary [0, {vocab_size})")
        if not (0.0 <= self.min_p <= 1.0):
            raise _bad_param("min_p", f"must be in [0, 1], got {self.min_p}")
        if not (self.repetition_penalty > 0.0):
            raise _bad_param("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (-2.0 <= v <= 2.0):
                raise _bad_param(name, f"must be in [-2, 2], got {v}")
        if self.logprobs is not None and not (0 <= self.logprobs <= 20):
            raise _bad_param("logprobs", f"must be in [0, 20], got {self.logprobs}")
        for s in self.stop:
            if not s:
                raise _bad_param("stop", "stop strings must be non-empty")
        for t, b in self.logit_bias.items():
            if not (0 <= t < vocab_size):
                raise _bad_param("logit_bias", f"token id {t} outside the vocabulary [0, {vocab_size})")
            if not math.isfinite(b):
                raise _bad_param("logit_bias", f"the bias of token {t} must be a finite number, got {b}")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise _bad_param("allowed_token_ids", "must not be empty")
            for t in self.allowed_token_ids:
                if not (0 <= t < vocab_size):
                    raise _bad_param("allowed_token_ids",
                                     f"token id {t} outside the vocabulary [0, {vocab_size})")
        self._validate_extras()

    def _validate_extras(self) -> None:
        """truncate_prompt_tokens; reasoning_max_tokens >= 0 (whether the model can think is the
        engine's check); lora_name a non-empty string (whether it is loaded is the engine's)."""
        if self.lora_name is not None and (not isinstance(self.lora_name, str) or not self.lora_name):
            raise _bad_param("lora_name", f"must be a non-empty string (a LoRA adapter), got {self.lora_name!r}")
        if self.truncate_prompt_tokens is not None and not (self.truncate_prompt_tokens >= 1
                                                            or self.truncate_prompt_tokens == -1):
            raise _bad_param("truncate_prompt_tokens",
                             f"must be >= 1 or -1, got {self.truncate_prompt_tokens}")
        if self.reasoning_max_tokens is not None and not self.reasoning_max_tokens >= 0:
            raise _bad_param("reasoning_max_tokens", f"must be >= 0 (0 ends the thinking at once), "
                                                     f"got {self.reasoning_max_tokens}")

    def truncated_prompt(self, prompt_token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt as the engine runs it: its last truncate_prompt_tokens tokens (-1: the last
        max_model_len - 1), or all of it."""
        k = self.truncate_prompt_tokens
        if k is None:
            return prompt_token_ids
        if k == -1:
            k = max_model_len - 1
        return prompt_token_ids[-k:] if 0 < k < len(prompt_token_ids) else prompt_token_ids
