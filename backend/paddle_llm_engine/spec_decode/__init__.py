"""Speculative decoding (EngineConfig.speculative_method): n-gram / prompt-lookup proposals
(ngram.py) verified by the target model in one step and accepted by the rejection rule
(rejection.py). See ngram.py for the step-level flow."""

from paddle_llm_engine.spec_decode.ngram import NgramProposer, propose_ngram
from paddle_llm_engine.spec_decode.rejection import accept_or_resample

__all__ = ["NgramProposer", "accept_or_resample", "propose_ngram"]
