"""A sequence: one request's tokens, its place in the scheduler and its KV block table (token state:
what the scheduler and the finishing rules read; sampling and output state live in the request's
state, request_state.py)."""

from __future__ import annotations

import enum
import time

from paddle_llm_engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Token state of one request.

    token_ids: prompt followed by generated tokens.
    num_computed_tokens: how many leading tokens have their K/V in the cache. A step computes
        token_ids[num_computed_tokens : num_computed_tokens + n]; when that reaches the last token,
        the step samples the next one. Preemption (recompute) resets it to 0.
    block_table: KV block ids; token at position p is in block_table[p // block_size].
    seq_index: which of the request's params.n sequences this is (its sampling state draws with
        the seed params.seed + seq_index).
    params: the request's (frozen) SamplingParams; max_tokens and eos_token_ids: as the engine
        resolved them for the request.
    num_new_blocks / num_reused_blocks: KV blocks this sequence took fresh (copies on write
        included) / found in the prefix cache, over its life (request perf metrics).
    num_cached_tokens: prompt tokens found in the prefix cache when it was first scheduled (None
        until then; a resumption after preemption does not change it): OpenAI's cached_tokens.
    spec: its speculative-decoding acceptance record (spec_decode.ngram.SpecState), or None when
        it does not speculate (speculation off, or a guided request).
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 max_tokens: int, eos_token_ids: list[int], arrival_time: float | None = None,
                 seq_index: int = 0):
        self.request_id = request_id
        self.seq_index = seq_index
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.max_tokens = max_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop_token_ids = frozenset(params.stop_token_ids)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chain hashes of the leading full, computed blocks
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.arrival_time = arrival_time if arrival_time is not None else time.monotonic()
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.num_new_blocks = 0
        self.num_reused_blocks = 0
        self.num_cached_tokens: int | None = None
        self.cumulative_logprob = 0.0
        self.pending_logprobs: list[tuple[float, list[tuple[int, float]]]] = []  # not yet reported
        self.spec = None
        self.lora = None  # the LoraAdapter the sequence runs with (None: the base model)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_pending_tokens(self) -> int:
        """Tokens whose K/V are not yet in the cache (prompt, chunk remainder or recompute)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))

    def record_logprob(self, logprob: float, top: list[tuple[int, float]]) -> None:
        """The sampled token's logprob and top alternatives (the scheduler's Scheduler.append_token)."""
        self.cumulative_logprob += logprob
        self.pending_logprobs.append((logprob, top))

    def check_stop(self, max_model_len: int) -> str | None:
        """Finish reason after the last appended token, or None to keep going.

        EOS and stop ids count only once min_tokens outputs exist (EOS skipped with ignore_eos).
        The token that triggered a stop stays in token_ids; the detokenizer drops special tokens.
        """
        n_out = self.num_output_tokens
        last = self.token_ids[-1]
        if n_out >= self.params.min_tokens:
            if last in self.stop_token_ids:
                return "stop"
            if not self.params.ignore_eos and last in self.eos_token_ids:
                return "stop"
        if n_out >= self.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None
