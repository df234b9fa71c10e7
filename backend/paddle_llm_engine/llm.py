"""Offline batch API over the same engine: LLM(model_dir).generate(prompts, params)."""

from __future__ import annotations

from collections import deque
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
        """Run every prompt to its end with continuous batching: prompts join the engine as long as
        fewer than max_num_waiting wait beyond the free running slots (the serving admission limit is not an error here, so any
        number of prompts can be given), in order.

        prompts: strings (tokenized as the tokenizer config says) or token id lists.
        Raises InvalidRequestError for a bad prompt or parameter (when that prompt joins).
        """
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if any(sp.n != 1 for sp in params):
            raise ValueError("LLM.generate returns one completion per prompt: n must be 1 "
                             "(LLMEngine serves n > 1, one output per sequence)")
        ids = [p if isinstance(p, list) else encode_prompt(self.tokenizer, p) for p in prompts]
        rids = [f"offline-{i}" for i in range(len(prompts))]
        pending = deque(zip(rids, ids, params))
        limit = self.engine.config.max_num_waiting

        def feed():
            while pending and self.engine.num_backlog < limit:
                self.engine.add_request(*pending.popleft())

        texts = {r: [] for r in rids}
        toks = {r: [] for r in rids}
        reasons = {}
        feed()
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                texts[out.request_id].append(out.text)
                toks[out.request_id].extend(out.token_ids)
                if out.finished:
                    reasons[out.request_id] = out.finish_reason
            feed()
        return [Completion(p, toks[r], "".join(texts[r]), reasons[r]) for r, p in zip(rids, ids)]
