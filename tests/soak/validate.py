"""Is every response well-formed? Parsing of one response (gRPC result or HTTP JSON / SSE event) into
a `Resp`, and the checks over the responses of one request (`check_responses`), returning the list
of problems (empty = well-formed). Malformed means the contract is broken, not that the text is bad:
text_output a str on every response, finish_reason in the allowed set, token counts consistent with
max_tokens, the sequences of n > 1 all present, no U+FFFD in greedy deltas, guided JSON that parses
when generation ended by itself."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

LLM_FINAL_REASONS = ("stop", "length")
LLM_INTERMEDIATE_REASON = "None"  # vLLM backend: str(None) on responses that do not end the sequence
REPLACEMENT = "\ufffd"


@dataclasses.dataclass
class Spec:
    """What one request asked for (what its responses are checked against)."""

    model: str            # ensemble | llm | llm_tp2
    max_tokens: int
    stream: bool
    n: int = 1
    greedy: bool = True
    guided_json: bool = False
    finish_reason: bool = False  # llm: return_finish_reason sent
    token_counts: bool = True    # the responses say how many tokens they carry
    stopped: bool = False        # a TensorRT-LLM stop request targets it: "abort" may end it


@dataclasses.dataclass
class Resp:
    """One response as the checks see it: arrival time, text delta, finish_reason, tokens it carried, sequence."""
    t: float
    text: str | None
    finish_reason: str | None = None
    tokens: int | None = None
    seq: int = 0


def _first(arr):
    if arr is None:
        return None
    a = np.asarray(arr)
    return None if a.size == 0 else a.reshape(-1)[0]


def _text(v, problems: list) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(f"text_output is not UTF-8: {e}")
            return v.decode("utf-8", "replace")
    if isinstance(v, str):
        return v
    problems.append(f"text_output is {type(v).__name__}, not a string")
    return str(v)


def parse_grpc(spec: Spec, result, t: float, problems: list) -> Resp:
    """A tritonclient InferResult -> Resp (problems appended)."""
    text = _text(_first(result.as_numpy("text_output")), problems)
    if text is None:
        problems.append("a response without text_output")
    reason = _first(result.as_numpy("finish_reason"))
    reason = reason.decode() if isinstance(reason, bytes) else reason
    if spec.model == "ensemble":
        lps = result.as_numpy("output_log_probs")
        tokens = None if lps is None else int(np.asarray(lps).size)
        seq = _first(result.as_numpy("sequence_index"))
    else:
        n = _first(result.as_numpy("num_output_tokens"))
        tokens = None if n is None else int(n)
        seq = None
    return Resp(t, text, reason, tokens, int(seq) if seq is not None else 0)


def parse_json(spec: Spec, body: dict, t: float, problems: list) -> Resp:
    """An HTTP generate body or generate_stream event -> Resp."""
    if "text_output" not in body:
        problems.append(f"a response without text_output: {str(body)[:200]}")
    v = body.get("text_output")
    if v is not None and not isinstance(v, str):
        problems.append(f"text_output is {type(v).__name__}, not a string")
    text = v if isinstance(v, str) else (None if v is None else str(v))
    tokens = None
    if spec.model == "ensemble":
        lps = body.get("output_log_probs")
        if lps is not None:
            tokens = len(lps) if isinstance(lps, list) else 1
        if "num_output_tokens" in body:
            tokens = int(body["num_output_tokens"])
    elif "num_output_tokens" in body:
        tokens = int(body["num_output_tokens"])
    seq = body.get("sequence_index", 0)
    return Resp(t, text, body.get("finish_reason"), tokens, int(seq) if isinstance(seq, (int, float)) else 0)


def check_responses(spec: Spec, resps: list[Resp], complete: bool) -> list[str]:
    """Problems of a request's responses. complete: the request ended normally (final response seen),
    so end-of-generation rules apply; False for cancelled / failed requests (only the responses
    received are checked)."""
    problems: list[str] = []
    if complete and not resps:
        problems.append("finished without any response carrying outputs")
    if not spec.stream and complete and spec.n == 1 and len(resps) != 1:
        problems.append(f"non-streamed request got {len(resps)} responses")
    by_seq: dict[int, list[Resp]] = {}
    for r in resps:
        by_seq.setdefault(r.seq, []).append(r)
    if any(s < 0 or s >= spec.n for s in by_seq):
        problems.append(f"sequence_index outside 0..{spec.n - 1}: {sorted(by_seq)}")
    if complete and spec.n > 1 and sorted(by_seq) != list(range(spec.n)):
        problems.append(f"n={spec.n} but responses for sequences {sorted(by_seq)}")
    for seq, rs in by_seq.items():
        problems += _check_sequence(spec, rs, complete, seq)
    return problems


def _check_sequence(spec: Spec, rs: list[Resp], complete: bool, seq: int) -> list[str]:
    p: list[str] = []
    where = f" (sequence {seq})" if spec.n > 1 else ""
    if spec.finish_reason:
        for i, r in enumerate(rs):
            last = i == len(rs) - 1
            if r.finish_reason is None:
                p.append(f"finish_reason missing on response {i}{where}")
            elif not last and r.finish_reason != LLM_INTERMEDIATE_REASON:
                p.append(f"finish_reason {r.finish_reason!r} on response {i} of {len(rs)}, before the end{where}")
            elif last and complete and r.finish_reason not in LLM_FINAL_REASONS:
                p.append(f"final finish_reason {r.finish_reason!r} not in {LLM_FINAL_REASONS}{where}")
            elif last and not complete and r.finish_reason not in (
                    LLM_FINAL_REASONS + (LLM_INTERMEDIATE_REASON,) + (("abort",) if spec.stopped else ())):
                p.append(f"finish_reason {r.finish_reason!r} not allowed{where}")
    counts = [r.tokens for r in rs]
    total = None
    if spec.token_counts and spec.stream:
        if any(c is None for c in counts):
            p.append(f"a streamed response without its token count{where}")
        else:
            total = sum(counts)
            if any(c < 0 for c in counts):
                p.append(f"negative token count {counts}{where}")
            if total > spec.max_tokens:
                p.append(f"{total} tokens streamed, max_tokens {spec.max_tokens}{where}")
    reason = rs[-1].finish_reason if rs and spec.finish_reason else None
    if complete and reason == "length" and total is not None and total != spec.max_tokens:
        p.append(f"finish_reason length after {total} tokens, max_tokens {spec.max_tokens}{where}")
    text = "".join(r.text or "" for r in rs)
    if spec.greedy and spec.stream:
        bad = [r.text for r in rs[:-1] if r.text and REPLACEMENT in r.text]
        if bad:
            p.append(f"U+FFFD in streamed deltas {bad[:3]!r}{where}")
    if spec.guided_json and complete and _ended_by_itself(spec, rs, reason, total):
        try:
            json.loads(text)
        except ValueError as e:
            p.append(f"guided JSON ended by itself but does not parse ({e}): {text[:200]!r}{where}")
    return p


def _ended_by_itself(spec: Spec, rs: list[Resp], reason: str | None, total: int | None) -> bool:
    """Generation stopped at EOS / a stop condition (not at max_tokens)."""
    if spec.finish_reason:
        return reason == "stop"
    if total is None:
        counts = [r.tokens for r in rs]
        total = sum(counts) if counts and all(c is not None for c in counts) else None
    return total is not None and total < spec.max_tokens
