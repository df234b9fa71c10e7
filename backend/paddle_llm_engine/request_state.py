"""The engine's state of one request in flight, beside the scheduler's token state (sequence.py).

RequestState: its params.n sequences (SequenceState, index = Sequence.seq_index), the siblings still
waiting to fork from sequence 0, how many are unfinished, and its deadline. Sequences 1.. wait in
`pending` until sequence 0 samples its first token; then they are forked from it (sharing its KV
blocks, Scheduler.fork) and draw their own first token from its logits row.
SequenceState: one sequence's sampling state (sampler.SamplingState: generator, masks, bias arrays,
guide) and its output processing: incremental detokenization, stop strings, the tokens and
logprobs not yet reported, and the RequestOutput of each step (output()).
"""

from __future__ import annotations

from dataclasses import dataclass

from paddle_llm_engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from paddle_llm_engine.outputs import RequestOutput
from paddle_llm_engine.request import PreparedRequest
from paddle_llm_engine.sampler import SamplingState
from paddle_llm_engine.sequence import Sequence


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


class SequenceState:
    """One sequence of a request: seq (token state), sampling (sampler.SamplingState) and the
    output side (detokenizer, stop-string matcher, tokens not yet reported, and with a reasoning
    parser the text split of what is sent into reasoning and answer: `split`, else None)."""

    def __init__(self, seq: Sequence, sampling: SamplingState, tokenizer, reasoning=None, thinks_at_start=False):
        self.seq = seq
        self.sampling = sampling
        prm = seq.params
        keep = reasoning.special_marker_ids if reasoning is not None else frozenset()
        self.detok = IncrementalDetokenizer(tokenizer, seq.token_ids, prm.skip_special_tokens,
                                            prm.spaces_between_special_tokens, keep_special=keep,
                                            hide_ids=reasoning.hidden_ids if keep else frozenset())
        self.stops = StopStringMatcher(prm.stop, include_stop=prm.include_stop_str_in_output)
        self.unreported: list[int] = []
        self.split = reasoning.text_parser(thinks_at_start) if reasoning is not None else None
        self.reasoning_text = self.content_text = ""  # this step's parts of the text (with `split`)

    def process(self, token: int, reason: str | None) -> tuple[str, str | None]:
        """Output processing of one appended token: (the text that can be sent now, the finish
        reason). reason: what the token state and the guide decided (None: the sequence goes on);
        a stop string ends it with "stop" (its text cut), and at the end the held-back text is
        flushed."""
        self.unreported.append(token)
        text, stopped = self.stops.push(self.detok.add([token]))
        if stopped:
            reason = "stop"
        elif reason is not None:
            tail, stopped = self.stops.push(self.detok.flush())
            text += tail if stopped else tail + self.stops.flush()
            reason = "stop" if stopped else reason
        if self.split is not None:
            r, c = self.split.feed(text)
            if reason is not None:
                r2, c2 = self.split.finish()
                r, c = r + r2, c + c2
            self.reasoning_text += r
            self.content_text += c
        return text, reason


class RequestState:
    """One request in flight (see the module docstring)."""

    def __init__(self, request_id: str, prepared: PreparedRequest, tokenizer, arrival_time: float | None):
        p, prm = prepared, prepared.params
        self.states: list[SequenceState] = []
        for i in range(prm.n):
            seq = Sequence(request_id, list(p.prompt_token_ids), prm, p.max_tokens, list(p.eos_token_ids),
                           arrival_time if i == 0 else self.states[0].seq.arrival_time, seq_index=i)
            seq.lora = p.lora
            thinking = p.reasoning.new_state(p.thinks_at_start, prm.reasoning_max_tokens) if p.reasoning else None
            sampling = SamplingState.create(prm, i, p.eos_token_ids, p.bad_words_ids,
                                            p.guides[i] if p.guides else None, thinking)
            self.states.append(SequenceState(seq, sampling, tokenizer, p.reasoning, p.thinks_at_start))
        self.pending = [st.seq for st in self.states[1:]]
        self.unfinished = len(self.states)
        self.deadline: Deadline | None = None

    @property
    def seq(self) -> Sequence:
        """Sequence 0 (the only one when n = 1)."""
        return self.states[0].seq

    def output(self, st: SequenceState, text: str, seq_finished: bool, reason: str | None = None) -> RequestOutput:
        """The output of one sequence since its last one; `finished` once the request's last
        sequence has ended. Times and KV block counts are the request's (all of its sequences)."""
        seq = st.seq
        ids, st.unreported = st.unreported, []
        lps, seq.pending_logprobs = seq.pending_logprobs, []
        seqs = [x.seq for x in self.states]
        reasoning = content = None
        if st.split is not None:
            reasoning, content, st.reasoning_text, st.content_text = st.reasoning_text, st.content_text, "", ""
        thinking = st.sampling.thinking
        firsts = [x.first_token_time for x in seqs if x.first_token_time is not None]
        lasts = [x.last_token_time for x in seqs if x.last_token_time is not None]
        return RequestOutput(
            request_id=seq.request_id, text=text, token_ids=ids, finished=self.unfinished == 0,
            finish_reason=reason if seq_finished else None, num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens, arrival_time=seq.arrival_time,
            first_scheduled_time=seqs[0].first_scheduled_time, num_preemptions=seq.num_preemptions,
            logprobs=lps, cumulative_logprob=seq.cumulative_logprob, sequence_index=seq.seq_index,
            sequence_finished=seq_finished, first_token_time=min(firsts) if firsts else None,
            last_token_time=max(lasts) if lasts else None,
            num_new_blocks=sum(x.num_new_blocks for x in seqs),
            num_cached_tokens=seqs[0].num_cached_tokens or 0,
            num_reused_blocks=sum(x.num_reused_blocks for x in seqs),
            reasoning_text=reasoning, content_text=content,
            num_reasoning_tokens=thinking.num_reasoning if thinking is not None else 0,
            num_sequences=len(self.states), max_tokens=seq.max_tokens)
