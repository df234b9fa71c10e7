"""Serving defaults applied to a request's SamplingParams after its contract parsed them."""

from __future__ import annotations

from paddle_llm_engine.sampling_params import SamplingParams


def apply_default_max_tokens(params: SamplingParams, num_prompt_tokens: int, max_model_len: int,
                             default_max_tokens: int) -> None:
    """The `llm` parameter default_max_tokens for a request that sends no max_tokens: capped at what
    fits (max_model_len - prompt tokens) so that a default never makes a request fail; 0 leaves
    max_tokens unset (the engine then generates up to max_model_len). num_prompt_tokens after
    truncate_prompt_tokens."""
    if params.max_tokens is None and default_max_tokens and num_prompt_tokens < max_model_len:
        params.max_tokens = min(default_max_tokens, max_model_len - num_prompt_tokens)
