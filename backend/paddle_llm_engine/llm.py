"""Offline batch API over the same engine: LLM(model_dir).generate(prompts, params)."""

from __future__ import annotations

from dataclasses import dataclass

from paddle_llm_engine.config import EngineConfig
from paddle_llm_engine.engine import LLMEngine
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.tokenizer import encode_prompt


@dataclass
class Completion:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str


class LLM:
    """Batch generation without a server. kwargs are EngineConfig fields."""

    def __init__(self, model_dir: str, **engine_kwargs):
        self.engine = LLMEngine(EngineConfig(model_dir=model_dir, **engine_kwargs))
        self.tokenizer = self.engine.tokenizer

    def generate(self, prompts: list[str] | list[list[int]], params: SamplingParams | list[SamplingParams]
                 ) -> list[Completion]:
        """Submit all prompts at once (continuous batching) and run until every one finishes.

        prompts: strings (tokenized as the tokenizer config says) or token id lists.
        Raises InvalidRequestError for a bad prompt or parameter.
        """
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if any(sp.n != 1 for sp in params):
            raise ValueError("LLM.generate returns one completion per prompt: n must be 1 "
                             "(LLMEngine serves n > 1, one output per sequence)")
        ids = [p if isinstance(p, list) else encode_prompt(self.tokenizer, p) for p in prompts]
        rids = [f"offline-{i}" for i in range(len(prompts))]
        for rid, p, sp in zip(rids, ids, params):
            self.engine.add_request(rid, p, sp)
        texts = {r: [] for r in rids}
        toks = {r: [] for r in rids}
        reasons = {}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                texts[out.request_id].append(out.text)
                toks[out.request_id].extend(out.token_ids)
                if out.finished:
                    reasons[out.request_id] = out.finish_reason
        return [Completion(p, toks[r], "".join(texts[r]), reasons[r]) for r, p in zip(rids, ids)]
