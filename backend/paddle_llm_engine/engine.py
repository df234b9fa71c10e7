"""The engine core: requests in, one scheduler + runner step at a time, RequestOutputs out.

Synchronous and single-threaded; `engine_loop.EngineLoop` runs it on its own thread for servers,
`llm.LLM` drives it directly for batch jobs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from dataclasses import dataclass

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.config import EngineConfig, ModelConfig
from paddle_llm_engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from paddle_llm_engine.errors import EngineBusyError, InvalidRequestError
from paddle_llm_engine.guided import GuidedDecoding
from paddle_llm_engine.outputs import EngineStats, RequestOutput
from paddle_llm_engine.platforms import resolve_device
from paddle_llm_engine.runner import create_runner
from paddle_llm_engine.sampling_params import SamplingParams, check_prompt_length
from paddle_llm_engine.scheduler import Scheduler
from paddle_llm_engine.sequence import Sequence
from paddle_llm_engine.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


class _RequestState:
    """Per-request output side: detokenizer, stop-string matcher, tokens not yet reported."""

    def __init__(self, seq: Sequence, tokenizer):
        self.seq = seq
        prm = seq.params
        self.detok = IncrementalDetokenizer(tokenizer, seq.token_ids, prm.skip_special_tokens,
                                            prm.spaces_between_special_tokens)
        self.stops = StopStringMatcher(prm.stop, include_stop=prm.include_stop_str_in_output)
        self.unreported: list[int] = []


class _Request:
    """One request: the states of its params.n sequences (index = Sequence.seq_index). Sequences
    1.. wait in `pending` until sequence 0 samples its first token; then they are forked from it
    (sharing its KV blocks, BlockManager.fork) and draw their own first token from its logits."""

    def __init__(self, states: list[_RequestState]):
        self.states = states
        self.pending = [st.seq for st in states[1:]]
        self.unfinished = len(states)
        self.deadline: Deadline | None = None

    @property
    def seq(self) -> Sequence:
        """Sequence 0 (the only one when n = 1)."""
        return self.states[0].seq


@dataclass(frozen=True)
class Deadline:
    """When a request must be over. at: time.monotonic() seconds; seconds: the limit it came from,
    counted from the request's arrival; source: which limit that is ("timeout": the caller's,
    "max_request_seconds": the engine setting), named in the error."""

    at: float
    seconds: float
    source: str

    @staticmethod
    def earliest(arrival: float, timeout_s: float | None, max_request_seconds: float) -> "Deadline | None":
        """The nearer of the caller's timeout and max_request_seconds (each None / 0 = none)."""
        best = None
        for seconds, source in ((timeout_s, "timeout"), (max_request_seconds, "max_request_seconds")):
            if seconds and (best is None or seconds < best.seconds):
                best = Deadline(arrival + seconds, float(seconds), source)
        return best

    def message(self, now: float, arrival: float, num_output_tokens: int) -> str:
        """The error a timed-out request ends with."""
        n = num_output_tokens
        where = f"{n} token{'s' if n > 1 else ''} generated" if n else "aborted before its first token"
        ran = now - arrival
        ran_text = f"{ran:.1f}" if ran >= 1 else f"{ran:.2f}"
        return f"deadline exceeded: the request ran {ran_text} s ({self.source} {_seconds(self.seconds)} s); {where}"


def _seconds(x: float) -> str:
    """2.0 -> "2.0", 0.25 -> "0.25": one decimal unless the value needs more."""
    return f"{x:.1f}" if round(x, 1) == x else f"{x:g}"


class LLMEngine:
    """One engine bound to one device.

    Raises ValueError at construction for bad settings (naming them), and InvalidRequestError from
    add_request for bad requests.
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model_dir)
        config.validate(self.model_config)
        self.device = resolve_device(config.device, config.device_id)
        t0 = time.monotonic()
        self.runner = create_runner(config, self.model_config, self.device)
        self.tokenizer = load_tokenizer(config.model_dir)
        self.block_manager = BlockManager(self.runner.num_kv_blocks, config.block_size,
                                          enable_prefix_caching=bool(config.enable_prefix_caching))
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.prefill_chunk_size)
        self.requests: dict[str, _Request] = {}
        # (deadline.at, tie-breaker, request id, _Request): earliest first. Entries of requests
        # that ended otherwise stay until popped or compacted (see _expire_deadlines).
        self._deadlines: list = []
        self._deadline_seq = itertools.count()
        self.num_timed_out = 0
        self.num_steps = 0
        # guided decoding: llguidance tokenizer built on the first guided request, not here
        self.guided = GuidedDecoding(config.model_dir, self.model_config.vocab_size, self.eos_token_ids)
        log.info("engine ready on %s in %.1f s: max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, "
                 "max concurrent tokens %d", self.device, time.monotonic() - t0, config.max_model_len,
                 config.max_num_seqs, config.max_num_batched_tokens,
                 self.runner.num_kv_blocks * config.block_size)

    def info(self) -> dict[str, str]:
        """What this engine runs on, as strings: device, dtype, kv_cache_dtype, kernels (the optional
        kernels the platform layer turned on, ';'-joined, or "composed"), quantization ("none" or
        "wint8"), tensor_parallel_size, and the admission limits max_num_seqs and max_num_waiting."""
        plan = getattr(self.runner, "plan", None)
        kernels = "composed"
        if plan is not None and any(plan.kernels.values()):
            kernels = ";".join(k for k, on in plan.kernels.items() if on)
            if plan.cpu_isa:
                kernels = kernels.replace("cpu_kernels", f"cpu_kernels_{plan.cpu_isa}")
        return {"device": self.device,
                "dtype": plan.dtype if plan else self.config.dtype,
                "kv_cache_dtype": plan.kv_cache_dtype if plan else self.config.kv_cache_dtype,
                "kernels": kernels if plan else self.config.kernels,
                "quantization": self.config.quantization or "none",
                "tensor_parallel_size": str(self.config.tensor_parallel_size),
                "max_num_seqs": str(self.config.max_num_seqs),
                "max_num_waiting": str(self.config.max_num_waiting)}

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

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None, timeout_s: float | None = None) -> None:
        """Queue a request.

        prompt_token_ids: the prompt's token ids (at least 1, below the vocabulary size).
        arrival_time: time.monotonic() seconds when the request arrived (default: now); latency
            metrics and the deadline count from it.
        timeout_s: the caller's deadline in seconds from arrival (None or 0 = none). The nearer of it
            and the max_request_seconds setting applies: at that time the engine aborts the request
            wherever it is (waiting or running), frees its KV blocks, and its final output has
            finish_reason "abort", timed_out True and `error` saying "deadline exceeded: ...".
        Raises InvalidRequestError (field named), EngineBusyError (max_num_waiting sequences are
        already waiting: a backstop, EngineLoop.submit refuses earlier) or ValueError (duplicate id,
        a negative or non-finite timeout)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s >= 0):
            raise ValueError(f"timeout_s must be >= 0 seconds (0 = none), got {timeout_s}")
        if self.num_waiting >= self.config.max_num_waiting:
            raise EngineBusyError(self.num_waiting, self.config.max_num_waiting)
        n = len(prompt_token_ids)
        limit = self.config.max_model_len
        if n == 0:
            raise InvalidRequestError("text_input", "the prompt is empty (0 tokens)")
        prompt_token_ids = params.truncated_prompt(prompt_token_ids, limit)  # truncate_prompt_tokens
        n = len(prompt_token_ids)
        check_prompt_length(n, limit)
        vocab = self.model_config.vocab_size
        bad = [t for t in (min(prompt_token_ids), max(prompt_token_ids)) if not 0 <= t < vocab]
        if bad:  # the embedding lookup would fail the whole step, and with it every request in flight
            raise InvalidRequestError("input_ids", f"token id {bad[0]} outside the vocabulary [0, {vocab})")
        params.validate(vocab)
        if params.bad_words and not params.bad_words_ids:
            params.bad_words_ids = [list(self.tokenizer.encode(w, add_special_tokens=False)) for w in params.bad_words]
        max_tokens = params.max_tokens if params.max_tokens is not None else limit - n
        if n + max_tokens > limit:
            raise InvalidRequestError(
                "max_tokens", f"prompt ({n} tokens) + max_tokens ({max_tokens}) exceeds max_model_len ({limit})")
        eos = params.eos_token_ids if params.eos_token_ids is not None else self.eos_token_ids
        seq = Sequence(request_id, prompt_token_ids, params, max_tokens, eos, arrival_time)
        if params.guide is not None:  # compile errors name the guide's field; first mask starts now
            stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos))
            seq.guide = self.guided.new_state(params.guide, sorted(stop_ids))
        seqs = [seq] + self._siblings(seq)
        req = _Request([_RequestState(s, self.tokenizer) for s in seqs])
        req.deadline = Deadline.earliest(seq.arrival_time, timeout_s, self.config.max_request_seconds)
        self.requests[request_id] = req
        if req.deadline is not None:
            heapq.heappush(self._deadlines, (req.deadline.at, next(self._deadline_seq), request_id, req))
        self.scheduler.add(seq)

    def _siblings(self, seq: Sequence) -> list[Sequence]:
        """Sequences 1 .. params.n - 1 of seq's request, each with its own seed (seq_index) and, when
        guided, its own guide state."""
        out = []
        guide = getattr(seq, "guide", None)
        for i in range(1, seq.params.n):
            c = Sequence(seq.request_id, seq.token_ids, seq.params, seq.max_tokens, seq.eos_token_ids,
                         seq.arrival_time, seq_index=i)
            if guide is not None:
                c.guide = self.guided.new_state(seq.params.guide, guide.stop_ids.tolist())
            out.append(c)
        return out

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its KV blocks now. Returns its final output, or None if unknown."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        for st in req.states:
            self.scheduler.finish(st.seq, "abort")
        req.unfinished = 0
        return self._output(req, req.states[0], "", seq_finished=True, reason="abort")

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
            seq = req.seq
            n_out = max(st.seq.num_output_tokens for st in req.states)
            out = self.abort_request(rid)
            out.error = req.deadline.message(now, seq.arrival_time, n_out)
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
        sch = self.scheduler
        return EngineStats(running=len(sch.running), waiting=len(sch.waiting),
                           kv_used_blocks=self.block_manager.num_used_blocks,
                           kv_free_blocks=self.block_manager.num_free_blocks,
                           prefix_cache_hit_ratio=self.block_manager.prefix_cache_hit_ratio,
                           num_preemptions_total=sch.num_preemptions)

    def close(self) -> None:
        """Release the runner's processes (tensor parallel workers); idempotent."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self, return_logits: bool = False) -> list[RequestOutput]:
        """Schedule, run the model once, and return an output for every request that advanced.

        return_logits: attach each sampled position's raw logits ([V] fp32) to its output
        (reference tests; costs a copy per row). Requests past their deadline are aborted first
        (their outputs come first in the list)."""
        expired = self._expire_deadlines(time.monotonic()) if self._deadlines else []
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return expired
        for s in sched.scheduled:  # n > 1: the other sequences fork when sequence 0 samples first
            if s.samples and s.seq.num_output_tokens == 0:
                req = self.requests.get(s.seq.request_id)
                if req is not None and req.pending:
                    s.forks = req.pending
        result = self.runner.execute(sched.scheduled, return_logits=return_logits, copies=sched.copies)
        self.num_steps += 1
        return expired + self._update_from_output(sched.scheduled, result, return_logits)

    def _update_from_output(self, scheduled, result, return_logits: bool) -> list[RequestOutput]:
        """Apply one step's StepResult: the only place where sequence, block and scheduler state
        change after a step (computed tokens, committed prefix blocks, new tokens and logprobs,
        stop checks, finished sequences). Returns the outputs of the requests that advanced."""
        for s in scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
            self.block_manager.commit_full_blocks(s.seq)
        for s in result.sampled:  # n > 1: the pending sequences now share sequence 0's blocks
            req = self.requests.get(s.seq.request_id) if s.forks else None
            if req is not None:
                for c in s.forks:
                    self.block_manager.fork(s.seq, c)
                    c.first_scheduled_time = s.seq.first_scheduled_time
                    self.scheduler.add_running(c)
                req.pending = []
        now = time.monotonic()
        items = [(row, s.seq, tok, result.logprobs[row])
                 for row, (s, tok) in enumerate(zip(result.sampled, result.token_ids.tolist()))]
        if result.forked:
            items += [(None, c, tok, lp) for c, tok, lp in
                      zip(result.forked, result.fork_token_ids.tolist(), result.fork_logprobs)]
        outputs = []
        for row, seq, token, logprob in items:
            req = self.requests.get(seq.request_id)
            if req is None or seq.is_finished:  # aborted between schedule and now
                continue
            st = req.states[seq.seq_index]
            seq.append_token(token)
            seq.record_logprob(*logprob)
            seq.last_token_time = now
            if seq.first_token_time is None:
                seq.first_token_time = now
            st.unreported.append(token)
            reason = seq.check_stop(self.config.max_model_len)
            if seq.guide is not None:  # guided: the chosen token advances the guide; complete = "stop"
                if seq.guide.ends(token):
                    reason = "stop"
                elif seq.guide.advance(token, prefetch=reason is None):
                    reason = "stop"
            text, stopped = st.stops.push(st.detok.add([token]))
            if stopped:
                reason = "stop"
            elif reason is not None:
                tail, stopped = st.stops.push(st.detok.flush())
                text += tail if stopped else tail + st.stops.flush()
                reason = "stop" if stopped else reason
            if reason is not None:
                self.scheduler.finish(seq, reason)
                req.unfinished -= 1
                if req.unfinished == 0:
                    del self.requests[seq.request_id]
            out = self._output(req, st, text, seq_finished=reason is not None, reason=reason)
            if return_logits and row is not None:
                out.logits = result.logits[row].copy()
            outputs.append(out)
        return outputs

    def _output(self, req: _Request, st: _RequestState, text: str, seq_finished: bool,
                reason: str | None = None) -> RequestOutput:
        """The output of one sequence; `finished` once the request's last sequence has ended. Times
        and KV block counts are the request's (all of its sequences)."""
        seq = st.seq
        ids, st.unreported = st.unreported, []
        lps, seq.pending_logprobs = seq.pending_logprobs, []
        seqs = [x.seq for x in req.states]
        firsts = [x.first_token_time for x in seqs if x.first_token_time is not None]
        lasts = [x.last_token_time for x in seqs if x.last_token_time is not None]
        return RequestOutput(
            request_id=seq.request_id, text=text, token_ids=ids, finished=req.unfinished == 0,
            finish_reason=reason if seq_finished else None, num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens, arrival_time=seq.arrival_time,
            first_scheduled_time=seqs[0].first_scheduled_time, num_preemptions=seq.num_preemptions,
            logprobs=lps, cumulative_logprob=seq.cumulative_logprob, sequence_index=seq.seq_index,
            sequence_finished=seq_finished, first_token_time=min(firsts) if firsts else None,
            last_token_time=max(lasts) if lasts else None,
            num_new_blocks=sum(x.num_new_blocks for x in seqs),
            num_reused_blocks=sum(x.num_reused_blocks for x in seqs))
