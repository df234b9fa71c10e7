"""The engine core: requests in, one scheduler + executor step at a time, RequestOutputs out.

Synchronous and single-threaded; `engine_loop.EngineLoop` runs it on its own thread for servers,
`llm.LLM` drives it directly for batch jobs. A step: the scheduler decides (scheduler.py), the
decisions become a plain-data Step (step.py), the executor runs it on the worker(s) and returns
the sampled rows' logits (executor/), the sampler draws the tokens here (sampler.py), the
scheduler applies the token state and the finishing rules, and each request's state turns its
tokens into text and outputs (request_state.py). Requests are checked once, on the caller's thread
(check_request, request.py).
With speculative decoding (EngineConfig.speculative_method "ngram") the scheduler also schedules
draft tokens (spec_decode/ngram.py) and the engine verifies them (_verify): a sequence may get
several tokens in one step, in one RequestOutput.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time

import numpy as np

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.config import EngineConfig, ModelConfig
from paddle_llm_engine.errors import EngineBusyError
from paddle_llm_engine.executor import create_executor
from paddle_llm_engine.kv_events import start_kv_events
from paddle_llm_engine.lora.engine_api import LoraEngineMixin
from paddle_llm_engine.guided import GuidedDecoding
from paddle_llm_engine.outputs import EngineStats, RequestOutput
from paddle_llm_engine.platforms import resolve_device
from paddle_llm_engine.reasoning import EngineReasoning
from paddle_llm_engine.request import PreparedRequest, RequestChecker
from paddle_llm_engine.request_state import Deadline, RequestState, SequenceState
from paddle_llm_engine.sampler import draw_speculative, sample
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.scheduler import Scheduler
from paddle_llm_engine.spec_decode.ngram import NgramProposer, SpecState
from paddle_llm_engine.step import Step, build_step
from paddle_llm_engine.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

__all__ = ["Deadline", "LLMEngine"]


def _chat_template(tokenizer) -> str | None:
    """The tokenizer's chat template text (the default one when it has several), or None."""
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):
        tpl = tpl.get("default") or next(iter(tpl.values()), None)
    return tpl if isinstance(tpl, str) else None


class LLMEngine(LoraEngineMixin):
    """One engine: a scheduler over a paged KV cache and an executor for its device(s).

    Raises ValueError at construction for bad settings (naming them), and InvalidRequestError from
    check_request / add_request for bad requests.
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model_dir)
        config.validate(self.model_config)
        self.device = resolve_device(config.device, config.device_id)
        t0 = time.monotonic()
        self.executor = create_executor(config, self.model_config, self.device)
        self.tokenizer = load_tokenizer(config.model_dir)
        self.block_manager = BlockManager(self.executor.num_kv_blocks, config.block_size,
                                          enable_prefix_caching=bool(config.enable_prefix_caching))
        self.proposer = None
        if config.speculative:
            self.proposer = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                          config.prompt_lookup_max, config.max_model_len)
        self.loras = self._start_loras()  # None: LoRA off
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.prefill_chunk_size, self.proposer, config.scheduling_policy,
                                   config.max_loras if self.loras is not None else 0)
        self.kv_events = start_kv_events(config, self.block_manager, self.device)  # None when off
        # speculative decoding counters (vLLM's spec-decode metrics), since start
        self.spec_num_drafts = 0
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.spec_accepted_per_pos = [0] * (config.num_speculative_tokens if config.speculative else 0)
        self.requests: dict[str, RequestState] = {}
        # (deadline.at, tie-breaker, request id, RequestState): earliest first. Entries of requests
        # that ended otherwise stay until popped or compacted (see _expire_deadlines).
        self._deadlines: list = []
        self._deadline_seq = itertools.count()
        self.num_timed_out = 0
        self.num_steps = 0
        # guided decoding: llguidance tokenizer built on the first guided request, not here
        self.guided = GuidedDecoding(config.model_dir, self.model_config.vocab_size, self.eos_token_ids)
        # thinking models: the parser requests use unless they name one (logged once)
        self.reasoning = EngineReasoning(config.reasoning_parser, self.model_config.model_type,
                                         _chat_template(self.tokenizer), self.tokenizer)
        self.checker = RequestChecker(config.max_model_len, self.model_config.vocab_size, self.tokenizer,
                                      self.eos_token_ids, self.guided, self.reasoning, self.loras)
        log.info("engine ready on %s in %.1f s: max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, "
                 "max concurrent tokens %d", self.device, time.monotonic() - t0, config.max_model_len,
                 config.max_num_seqs, config.max_num_batched_tokens,
                 self.executor.num_kv_blocks * config.block_size)

    def info(self) -> dict[str, str]:
        """What this engine runs on, as strings: device, dtype, kv_cache_dtype, kernels (the optional
        kernels the platform layer turned on, ';'-joined, or "composed"), quantization ("none",
        "wint8" or "wint4"), tensor_parallel_size, the admission limits max_num_seqs and max_num_waiting,
        max_model_len, enable_prefix_caching ("1" / "0"), speculative_method ("none", or "ngram:k"
        with k draft tokens per step) and reasoning_parser (the parser requests get by default, "none"). With tensor parallelism these are what the ranks decided (every
        rank decides alike)."""
        plan = self.executor.plan
        kernels = "composed"
        if any(plan.kernels.values()):
            kernels = ";".join(k for k, on in plan.kernels.items() if on)
            if plan.cpu_isa:
                kernels = kernels.replace("cpu_kernels", f"cpu_kernels_{plan.cpu_isa}")
        return {"device": str(self.device), "dtype": plan.dtype, "kv_cache_dtype": plan.kv_cache_dtype,
                "kernels": kernels, "quantization": plan.quantization or "none",
                "tensor_parallel_size": str(self.config.tensor_parallel_size),
                "max_num_seqs": str(self.config.max_num_seqs),
                "max_num_waiting": str(self.config.max_num_waiting),
                "max_model_len": str(self.config.max_model_len),
                "enable_prefix_caching": "1" if self.config.enable_prefix_caching else "0",
                "speculative_method": ("none" if self.config.speculative_method == "none" else
                                       f"{self.config.speculative_method}:{self.config.num_speculative_tokens}"),
                "reasoning_parser": self.reasoning.default.name if self.reasoning.default is not None else "none"}

    @property
    def eos_token_ids(self) -> list[int]:
        """Default EOS ids: generation_config.json, else config.json, else the tokenizer's."""
        if self.model_config.eos_token_ids:
            return self.model_config.eos_token_ids
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return [eos] if eos is not None else []

    @property
    def num_waiting(self) -> int:
        """Sequences in the scheduler's waiting queue (new and preempted)."""
        return len(self.scheduler.waiting)

    @property
    def num_free_seq_slots(self) -> int:
        """Running slots free now: max_num_seqs less the running sequences (>= 0)."""
        return max(0, self.config.max_num_seqs - len(self.scheduler.running))

    @property
    def num_backlog(self) -> int:
        """Waiting sequences that no free running slot can take: num_waiting less
        num_free_seq_slots (>= 0). This is what max_num_waiting bounds: a burst that arrives within
        one step and fits the free slots is about to run, not waiting. Equivalently, admission holds
        running + waiting below max_num_seqs + max_num_waiting."""
        return max(0, len(self.scheduler.waiting) - self.num_free_seq_slots)

    # -- intake --------------------------------------------------------------------------------
    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> PreparedRequest:
        """Check a request and prepare it for add_prepared; safe on any thread (EngineLoop.submit
        calls it on the caller's). prompt_token_ids: the prompt's token ids (at least 1, below the
        vocabulary size). Raises InvalidRequestError naming the field (request.py)."""
        return self.checker.check(prompt_token_ids, params)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None, timeout_s: float | None = None) -> None:
        """check_request, then add_prepared (one thread: the offline API and tests). Raises as both."""
        self.add_prepared(request_id, self.check_request(prompt_token_ids, params), arrival_time, timeout_s)

    def add_prepared(self, request_id: str, prepared: PreparedRequest, arrival_time: float | None = None,
                     timeout_s: float | None = None) -> None:
        """Queue a checked request (engine thread).

        arrival_time: time.monotonic() seconds when the request arrived (default: now); latency
            metrics and the deadline count from it.
        timeout_s: the caller's deadline in seconds from arrival (None or 0 = none). The nearer of it
            and the max_request_seconds setting applies: at that time the engine aborts the request
            wherever it is (waiting or running), frees its KV blocks, and its final output has
            finish_reason "abort", timed_out True and `error` saying "deadline exceeded: ...".
        Raises EngineBusyError (num_backlog has reached max_num_waiting: a backstop,
        EngineLoop.submit refuses earlier) or ValueError (duplicate id, a negative or non-finite
        timeout)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s >= 0):
            raise ValueError(f"timeout_s must be >= 0 seconds (0 = none), got {timeout_s}")
        if self.num_backlog >= self.config.max_num_waiting:
            raise EngineBusyError(self.num_backlog, self.config.max_num_waiting)
        req = RequestState(request_id, prepared, self.tokenizer, arrival_time)
        req.deadline = Deadline.earliest(req.seq.arrival_time, timeout_s, self.config.max_request_seconds)
        if self.proposer is not None:  # guided ones too: the guide sees accepted tokens only (_verify)
            for st in req.states:
                st.seq.spec = SpecState()
        self.requests[request_id] = req
        if req.deadline is not None:
            heapq.heappush(self._deadlines, (req.deadline.at, next(self._deadline_seq), request_id, req))
        self.scheduler.add(req.seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its KV blocks now. Returns its final output, or None if unknown."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        for st in req.states:
            self.scheduler.finish(st.seq, "abort")
        req.unfinished = 0
        return req.output(req.states[0], "", seq_finished=True, reason="abort")

    def _expire_deadlines(self, now: float) -> list[RequestOutput]:
        """Abort every request whose deadline has passed (waiting or running); their final outputs.
        Cost per step: a heap peek, plus log(n) per request that times out; entries of requests
        that already ended are dropped when they surface or when they outnumber the live ones."""
        outputs = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, rid, req = heapq.heappop(heap)
            if self.requests.get(rid) is not req:  # ended before its deadline (or the id was reused)
                continue
            n_out = max(st.seq.num_output_tokens for st in req.states)
            out = self.abort_request(rid)
            out.error = req.deadline.message(now, req.seq.arrival_time, n_out)
            out.error_code = "unavailable"
            out.timed_out = True
            self.num_timed_out += 1
            log.info("request %s: %s", rid, out.error)
            outputs.append(out)
        if len(heap) > 64 and len(heap) > 2 * len(self.requests):
            live = [e for e in heap if self.requests.get(e[2]) is e[3]]
            heapq.heapify(live)
            self._deadlines = live
        return outputs

    def stats(self) -> EngineStats:
        """The engine's gauges now (engine thread)."""
        sch = self.scheduler
        return EngineStats(running=len(sch.running), waiting=len(sch.waiting),
                           kv_used_blocks=self.block_manager.num_used_blocks,
                           kv_free_blocks=self.block_manager.num_free_blocks,
                           prefix_cache_hit_ratio=self.block_manager.prefix_cache_hit_ratio,
                           num_preemptions_total=sch.num_preemptions,
                           spec_num_drafts=self.spec_num_drafts, spec_num_draft_tokens=self.spec_num_draft_tokens,
                           spec_num_accepted_tokens=self.spec_num_accepted_tokens,
                           spec_accepted_per_pos=tuple(self.spec_accepted_per_pos),
                           **self._lora_stats())

    def close(self) -> None:
        """Release the executor's processes (tensor parallel workers) and the guided-decoding mask
        thread; idempotent."""
        self.executor.close()
        self.guided.close()
        if self.kv_events is not None:
            self.kv_events.close()

    def has_unfinished_requests(self) -> bool:
        """True while any request added is not finished."""
        return bool(self.requests)

    # -- one step ------------------------------------------------------------------------------
    def step(self, return_logits: bool = False) -> list[RequestOutput]:
        """Schedule, run the model once, and return an output for every request that advanced.

        return_logits: attach each sampled position's raw logits ([V] fp32) to its output
        (reference tests; costs a copy per row). Requests past their deadline are aborted first
        (their outputs come first in the list)."""
        expired = self._expire_deadlines(time.monotonic()) if self._deadlines else []
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return expired
        lora_slots, lora_loads = None, ()
        if self.loras is not None:
            lora_slots, lora_loads = self.loras.assign_slots([s.seq.lora for s in sched.scheduled
                                                              if s.seq.lora is not None])
        step = build_step(sched.scheduled, sched.copies, self._forks_of, lora_slots, lora_loads)
        logits = self.executor.execute(step)
        self.num_steps += 1
        outputs = expired + self._update_from_output(sched.scheduled, step, logits, return_logits)
        if self.kv_events is not None:
            self.kv_events.flush()  # this step's evictions and new cached blocks, one batch
        return outputs

    def _forks_of(self, seq) -> list:
        """n > 1: the sequences that fork from sequence 0 when it samples its first token."""
        req = self.requests.get(seq.request_id)
        return req.pending if req is not None else []

    def _sample(self, step: Step, logits: np.ndarray) -> list[tuple]:
        """The step's tokens: (row or None, SequenceState, token, logprob) for every sampled entry,
        then for every sibling forked this step (drawn with its own state from its parent's row)."""
        rows, states = [], []
        offsets = step.row_offsets()
        plain = [(row, s) for row, s in zip(offsets, step.sampled) if not s.draft_token_ids]  # drafts: _verify
        for row, s in plain:
            req = self.requests[s.request_id]
            rows.append(row)
            states.append(req.states[s.seq_index])
        k = len(rows)
        for row, s in plain:
            for i in s.forks:
                rows.append(row)
                states.append(self.requests[s.request_id].states[i])
        if not states:
            return []
        rows_logits = logits if rows == list(range(logits.shape[0])) else logits[rows]  # forks repeat their parent's row
        tokens, logprobs = sample(rows_logits, [st.seq for st in states], [st.sampling for st in states])
        return [(row if j < k else None, st, int(tok), lp)
                for j, (row, st, tok, lp) in enumerate(zip(rows, states, tokens.tolist(), logprobs))]

    def _verify(self, s, row0: int, logits: np.ndarray, now: float, return_logits: bool) -> RequestOutput | None:
        """Speculative decoding: verify the draft tokens of one entry (rows row0 .. row0 + drafts of
        `logits`, spec_decode/ngram.py's flow). Position by position, with the tokens accepted so
        far, accept the draft (sampler.draw_speculative) and append it as plain decoding does
        (_append_token); the first non-accepted token (correction), or the bonus token after every
        draft was accepted, is appended last; the first token that finishes the sequence ends it. Then the rollback (Scheduler.rollback) and the counters. Returns the
        sequence's output, or None when its request ended meanwhile.
        Guided decoding: each position's mask is the guide's after the tokens accepted before it
        (the guide consumes every appended token, guide_finished, before the next position is
        drawn); rejected drafts are never fed to it, so it needs no rollback. A draft the guide
        does not allow has probability 0 (is never the argmax) and is rejected."""
        req = self.requests.get(s.request_id)
        if req is None:
            return None
        st = req.states[s.seq_index]
        seq = st.seq
        if seq.is_finished:
            return None
        drafts = s.draft_token_ids
        texts, reason, accepted, row = [], None, 0, row0
        for j in range(len(drafts) + 1):
            row = row0 + j
            tok, ok, lp = draw_speculative(logits[row], seq, st.sampling, drafts[j] if j < len(drafts) else None)
            text, reason = self._append_token(req, st, tok, lp, now)
            texts.append(text)
            if ok:
                accepted += 1
                self.spec_accepted_per_pos[j] += 1
            if reason is not None or not ok:
                break
        self.spec_num_drafts += 1
        self.spec_num_draft_tokens += len(drafts)
        self.spec_num_accepted_tokens += accepted
        if seq.spec is not None:
            seq.spec.record(len(drafts), accepted)
        if reason is None:
            self.scheduler.rollback(seq, accepted)
        out = req.output(st, "".join(texts), seq_finished=reason is not None, reason=reason)
        if return_logits:
            out.logits = logits[row].copy()
        return out

    def _update_from_output(self, scheduled, step: Step, logits: np.ndarray, return_logits: bool
                            ) -> list[RequestOutput]:
        """Apply one step: the scheduler's token state (computed tokens, committed prefix blocks,
        forks, new tokens and logprobs, EOS / length), then each request's output processing
        (guide, detokenization, stop strings). Returns the outputs of the requests that advanced."""
        self.scheduler.advance(scheduled)
        sampled = self._sample(step, logits)
        for s in step.sampled:  # n > 1: the pending sequences now share sequence 0's blocks
            if s.forks:
                req = self.requests[s.request_id]
                self.scheduler.fork(req.states[s.seq_index].seq, req.pending)
                req.pending = []
        now = time.monotonic()
        outputs = []
        for row, st, token, logprob in sampled:
            req = self.requests.get(st.seq.request_id)
            if req is None or st.seq.is_finished:  # aborted between schedule and now
                continue
            text, reason = self._append_token(req, st, token, logprob, now)
            out = req.output(st, text, seq_finished=reason is not None, reason=reason)
            if return_logits and row is not None:
                out.logits = logits[row].copy()
            outputs.append(out)
        for row0, s in zip(step.row_offsets(), step.sampled):
            if s.draft_token_ids:
                out = self._verify(s, row0, logits, now, return_logits)
                if out is not None:
                    outputs.append(out)
        return outputs

    def _append_token(self, req: RequestState, st: SequenceState, token: int, logprob: tuple, now: float
                      ) -> tuple[str, str | None]:
        """Append one drawn token to a sequence, for plain decoding and for each token speculative
        verification keeps: the token state (token, logprob (its logprob, top alternatives), times,
        EOS / stop ids / max_tokens / max_model_len), the guide, then the output processing
        (detokenization, stop strings, reasoning split). A finish reason ends the sequence here
        (_finish). Returns (the text that can be sent now, the finish reason or None)."""
        reason = self.scheduler.append_token(st.seq, token, logprob, now, self.config.max_model_len)
        if st.sampling.guide_finished(token, goes_on=reason is None):
            reason = "stop"  # the guide is complete (or chose a stop id): guided sequences end here
        text, reason = st.process(token, reason)
        if reason is not None:
            self._finish(req, st, reason)
        return text, reason

    def _finish(self, req: RequestState, st: SequenceState, reason: str) -> None:
        """A sequence ended: its blocks are freed; the request leaves when its last one has."""
        self.scheduler.finish(st.seq, reason)
        req.unfinished -= 1
        if req.unfinished == 0:
            del self.requests[st.seq.request_id]
