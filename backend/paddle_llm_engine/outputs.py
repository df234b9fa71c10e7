"""What the engine hands back to its caller for a request after a step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    """Delta since the previous output of the same request.

    text: newly emitted text (may be "" while characters or stop-string prefixes are held back).
    token_ids: tokens sampled since the previous output (the stop token included).
    finished: the request is over (all of its sequences); nothing follows.
    sequence_index / sequence_finished: which of the request's params.n sequences this output
        belongs to, and whether that sequence has ended (always true with finished). With n = 1
        both flags are the same.
    finish_reason: "stop" | "length" | "abort" | "error" when the sequence finished, else None.
    error: message when the request failed: finish_reason "error", or "abort" with timed_out.
    error_code: with error: "invalid_arg" | "unavailable" | "internal" (the Triton glue's codes).
    rejected: why the engine refused the request before it was queued ("invalid": a bad field,
        "queue_full": max_num_waiting reached), else None; finish_reason is then "error".
    timed_out: the engine aborted the request at its deadline (finish_reason "abort", error says
        "deadline exceeded: ...", error_code "unavailable").
    reasoning_text / content_text: with a reasoning parser, the parts of `text` that are thinking and
        answer (markers dropped; reasoning/text_parser.py); None when the request has no thinking span
        (then `text` is all answer). `text` itself stays the raw output.
    num_reasoning_tokens: the sequence's output tokens inside its thinking span so far (up to and
        including the end marker), 0 without a reasoning parser.
    Times are time.monotonic() seconds. Request-level (all sequences): first_token_time (first
    token sampled), last_token_time (latest token sampled), num_new_blocks (KV blocks allocated
    fresh, copies on write included), num_reused_blocks (blocks found in the prefix cache),
    num_cached_tokens (prompt tokens of sequence 0 found in the prefix cache when it was first
    scheduled: OpenAI's usage.prompt_tokens_details.cached_tokens).
    num_sequences / max_tokens: the request's n and resolved max_tokens (vLLM's request_params_*).
    """

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    error_code: str = "invalid_arg"
    rejected: str | None = None
    timed_out: bool = False
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    num_preemptions: int = 0
    # per new token: (logprob of the chosen token, [(alt token id, logprob)] top params.logprobs)
    logprobs: list = field(default_factory=list)
    cumulative_logprob: float = 0.0
    logits: "object | None" = None  # np.ndarray [V] fp32, only with LLMEngine.step(return_logits=True)
    sequence_index: int = 0
    sequence_finished: bool = False
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_new_blocks: int = 0
    num_reused_blocks: int = 0
    num_cached_tokens: int = 0
    reasoning_text: str | None = None
    content_text: str | None = None
    num_reasoning_tokens: int = 0
    num_sequences: int = 1        # the request's params.n
    max_tokens: int | None = None  # the request's resolved max_tokens

    def __post_init__(self):
        if self.finished:
            self.sequence_finished = True


@dataclass
class EngineStats:
    """Engine gauges, read on the engine thread (counts of requests and KV blocks), and counters since
    start. Speculative decoding (vLLM's spec-decode counters; 0 / () when it is off):
    spec_num_drafts: verify steps of a sequence with draft tokens; spec_num_draft_tokens: draft
    tokens proposed; spec_num_accepted_tokens: of which accepted; spec_accepted_per_pos[i]: drafts
    accepted at position i (0-based) of their proposal."""

    running: int
    waiting: int
    kv_used_blocks: int
    kv_free_blocks: int
    prefix_cache_hit_ratio: float
    num_preemptions_total: int
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple = ()
    max_loras: int = 0  # LoRA (0: off): device slots, and the adapter names of running / waiting sequences
    lora_running: tuple = ()
    lora_waiting: tuple = ()

    @property
    def kv_usage_ratio(self) -> float:
        total = self.kv_used_blocks + self.kv_free_blocks
        return self.kv_used_blocks / total if total else 0.0
