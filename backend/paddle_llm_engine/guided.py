"""Guided (structured) decoding with llguidance: a request's output is constrained to a JSON schema,
a regular expression, a list of choices or a grammar.

- GuideSpec: what a request asks for (set on SamplingParams.guide by the client contracts).
- GuidedDecoding: one per engine. Builds the llguidance tokenizer from the model folder's
  tokenizer.json once, lazily, on the first guided request, and a GuideState (an LLMatcher) per
  sequence when its request is checked (LLMEngine.check_request, on the caller's thread: this
  class is thread-safe); a guide that does not compile is an InvalidRequestError naming the
  request field the guide came from.
- GuideState: the sequence's matcher and its next allowed-token mask. The mask is computed on a
  worker thread (llguidance releases the GIL) right after the previous token was consumed, so it
  is built while the engine runs the next model step; the sampler only waits for it and applies
  it to its row. The engine feeds each chosen token back (sampler.SamplingState.guide_finished).

EOS: the sequence's stop ids (EOS unless ignore_eos, and stop_token_ids) are allowed exactly when
the guide is in an accepting state; the guide's own idea of EOS is replaced by them. When the guide
cannot be extended any more, the engine finishes the sequence at once with finish_reason "stop"
(no extra step to produce an EOS token). Ids beyond the tokenizer's vocabulary (config.json
vocab_size may be larger) are never allowed. Unguided requests never touch this module.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from paddle_llm_engine.errors import ErrorCode, InvalidRequestError
from paddle_llm_structured.any_json import any_json_schema
from paddle_llm_structured.closed_schema import close_schema
from paddle_llm_structured.json_layout import json_options

log = logging.getLogger(__name__)

GUIDE_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class GuideSpec:
    """One request's constraint.

    kind: "json_schema" (value: the schema as JSON text), "json_object" (any JSON object whose
        objects and arrays have at most paddle_llm_structured.any_json.MAX_ENTRIES entries; value
        unused), "regex" (value: the pattern; the whole output must match it), "choice" (value: a
        JSON list of strings; the output is exactly one of them), "grammar" (value: a GBNF / EBNF
        grammar as llama.cpp and xgrammar write them, `root ::= ...`, or a Lark grammar).
    field: the request field the guide came from, as the caller names it for its clients (default
        "guide"); errors name it (INVALID_GUIDE).
    whitespace_flexible: JSON kinds: True (default) allows the bounded whitespace of
        paddle_llm_structured.json_layout between tokens; False is compact JSON (vLLM's
        disable_any_whitespace); whitespace_pattern: JSON kinds: a regex for each whitespace run
        (wins over both). A schema's own top-level `x-guidance` keys win over these.
    additional_properties: JSON kinds: False (default) closes every object of the schema that does
        not say otherwise (paddle_llm_structured.closed_schema: only the keys the schema names);
        True keeps the schema as written (JSON Schema's open objects).
    """

    kind: str
    value: str = ""
    field: str = "guide"
    whitespace_flexible: bool = True
    whitespace_pattern: str | None = None
    additional_properties: bool = False

    def grammar(self) -> str:
        """The llguidance grammar of this guide. Raises InvalidRequestError (naming `field`) when the
        guide cannot be turned into one; compile errors proper show up in check() / the matcher."""
        import llguidance

        try:
            if self.kind in ("json_schema", "json_object"):
                schema = json.loads(self.value) if self.kind == "json_schema" else any_json_schema()
                if not isinstance(schema, (dict, bool)):
                    raise ValueError("a JSON schema must be a JSON object")
                if not self.additional_properties:
                    schema = close_schema(schema)
                opts = json_options(self.whitespace_flexible, self.whitespace_pattern, schema)
                return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=opts)
            if self.kind == "regex":
                return llguidance.grammar_from("regex", self.value)
            if self.kind == "choice":
                return llguidance.grammar_from("choice", self.value)
            if self.kind == "grammar":
                return llguidance.grammar_from("grammar", self.value)
        except InvalidRequestError:
            raise
        except Exception as e:  # json / GBNF conversion errors
            raise InvalidRequestError(self.field, f"invalid {self.kind.replace('_', ' ')}: {e}",
                                      ErrorCode.INVALID_GUIDE) from None
        raise InvalidRequestError(self.field, f"unknown guide kind {self.kind!r} (one of {', '.join(GUIDE_KINDS)})",
                                  ErrorCode.INVALID_GUIDE)

    def check(self) -> None:
        """Compile the guide without a tokenizer (cheap: milliseconds), so that a malformed schema,
        regex or grammar is an InvalidRequestError when the request arrives."""
        import llguidance

        err = llguidance.LLMatcher.validate_grammar(self.grammar())
        if err:
            raise InvalidRequestError(self.field, f"invalid {self.kind.replace('_', ' ')}: {_first_lines(err)}",
                                      ErrorCode.INVALID_GUIDE)


def _first_lines(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[:n])


class GuideState:
    """One sequence's matcher and its next allowed-token mask (see the module docstring).

    Thread use: the worker thread runs _compute (matcher mask); the engine thread calls apply
    (waits for that mask) and then advance (consume the chosen token, start the next mask). A
    mask is always finished before the token it constrains is consumed, so the two never touch
    the matcher at the same time."""

    def __init__(self, owner: "GuidedDecoding", matcher, stop_ids: list[int]):
        self._owner = owner
        self.matcher = matcher
        self.stop_ids = np.asarray(sorted(set(stop_ids)), dtype=np.int64)
        # every id that ends the sequence when chosen under the guide: its stop ids and the EOS ids
        # llguidance knows (only ever allowed when the guide is stuck, see _compute)
        self._ending = frozenset(self.stop_ids.tolist()) | owner.tokenizer_eos_ids
        self._bitmask = np.zeros(owner.mask_words, dtype=np.int32)
        self._future: Future | None = None
        # the next mask as an index list, whichever side is shorter: the allowed ids (sparse) or
        # the blocked ids (dense); applying it then costs one [V] copy plus min(allowed, blocked)
        self._sparse = True
        self._ids: np.ndarray | None = None
        self.prefetch()

    def prefetch(self) -> None:
        """Start computing the mask for the next token (worker thread)."""
        self._ids = None
        self._future = self._owner.submit(self._compute)

    def _compute(self) -> None:
        m = self.matcher
        m.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        allowed = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little",
                                count=self._owner.vocab_size).view(np.bool_)
        eos = self._owner.tokenizer_eos_array
        if eos.size:
            allowed[eos] = False
        if self.stop_ids.size:
            allowed[self.stop_ids] = m.is_accepting()
        ids = np.flatnonzero(allowed)
        if ids.size == 0:  # the guide is stuck (e.g. an unsatisfiable schema): let the sequence end
            log.warning("guided decoding: no token is allowed (%s); ending the sequence",
                        m.get_error() or "the guide cannot be extended")
            ending = np.asarray(sorted(self._ending), dtype=np.int64)
            allowed[ending] = True
            ids = ending
        self._sparse = 2 * ids.size <= allowed.size
        self._ids = ids if self._sparse else np.flatnonzero(~allowed)

    def _wait(self) -> None:
        if self._future is not None:
            self._future.result()  # re-raises a worker failure on the engine thread
            self._future = None

    def apply(self, row: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """The row with every token the guide does not allow at -inf (a new array; `row` is not
        changed). raw: the model's logits for the row (`row` itself when nothing else changed it).
        When nothing allowed is left finite in a changed `row` (e.g. min_tokens masked the stop ids
        that are the only way on), the guide wins: `raw` masked instead."""
        self._wait()
        ids = self._ids
        if self._sparse:
            out = np.full(row.shape, -np.inf, dtype=row.dtype)
            vals = row[ids]
            if row is not raw and not np.isfinite(vals).any():
                vals = raw[ids]
            out[ids] = vals
            return out
        out = row.copy()
        out[ids] = -np.inf
        if row is not raw and not out.max() > -np.inf:
            out = raw.copy()
            out[ids] = -np.inf
        return out

    def ends(self, token: int) -> bool:
        """True when the chosen token ends the sequence under the guide (a stop id, or an EOS id
        allowed because the guide was stuck)."""
        return token in self._ending

    def advance(self, token: int, prefetch: bool = True) -> bool:
        """Consume the chosen token and, with `prefetch` (the sequence goes on), start the next mask
        unless the guide is complete. Returns True when the guide is complete (nothing more can
        follow): the sequence is done."""
        self._wait()
        if not self.matcher.consume_token(int(token)):
            log.error("guided decoding: the guide rejected token %d it had allowed (%s); ending the sequence",
                      token, self.matcher.get_error())
            return True
        if self.matcher.is_stopped():
            return True
        if prefetch:
            self.prefetch()
        return False


class GuidedDecoding:
    """Per engine: the llguidance tokenizer (built once, on first use) and the mask worker."""

    def __init__(self, model_dir: str, vocab_size: int, eos_token_ids: list[int]):
        self.model_dir = model_dir
        self.vocab_size = vocab_size  # the model's (logit row length)
        self.eos_token_ids = list(eos_token_ids)
        self._tokenizer = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.mask_words = 0
        self.tokenizer_eos_ids: frozenset[int] = frozenset()
        self.tokenizer_eos_array = np.empty(0, dtype=np.int64)

    @property
    def tokenizer(self):
        """The llguidance LLTokenizer of the model folder's tokenizer.json (about 1 s, once)."""
        with self._lock:
            if self._tokenizer is None:
                import llguidance

                t0 = time.monotonic()
                path = os.path.join(self.model_dir, "tokenizer.json")
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                eos = self.eos_token_ids or None
                try:  # the model's vocabulary may be larger than the tokenizer's: those ids stay masked
                    tok = llguidance.LLTokenizer(text, n_vocab=self.vocab_size, eos_token=eos)
                except ValueError:  # the tokenizer has more ids than the model: masks are cut to the model's
                    tok = llguidance.LLTokenizer(text, eos_token=eos)
                self.mask_words = (tok.vocab_size + 31) // 32
                self.tokenizer_eos_ids = frozenset(int(t) for t in tok.eos_tokens if 0 <= t < self.vocab_size)
                self.tokenizer_eos_array = np.asarray(sorted(self.tokenizer_eos_ids), dtype=np.int64)
                self._tokenizer = tok
                log.info("guided decoding: llguidance %s tokenizer from %s (%d tokens, model vocabulary %d) "
                         "built in %.2f s", llguidance.__version__, path, tok.vocab_size, self.vocab_size,
                         time.monotonic() - t0)
            return self._tokenizer

    def submit(self, fn) -> Future:
        """Run fn on the mask worker thread (started on first use). Raises RuntimeError after close()."""
        with self._lock:
            if self._closed:
                raise RuntimeError("guided decoding is closed (the engine was closed)")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-guided-mask")
            return self._executor.submit(fn)

    def close(self) -> None:
        """Stop the mask worker thread (masks not yet started are cancelled); idempotent. Called by
        LLMEngine.close: an engine closed and rebuilt in the same process (a model reload) would
        otherwise leave one idle thread behind each time."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def new_state(self, spec: GuideSpec, stop_ids: list[int]) -> GuideState:
        """Compile the guide for one sequence and start its first mask. Raises InvalidRequestError
        naming spec.field when it does not compile."""
        import llguidance

        grammar = spec.grammar()
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(spec.field, f"invalid {spec.kind.replace('_', ' ')}: "
                                                  f"{_first_lines(matcher.get_error())}", ErrorCode.INVALID_GUIDE)
        return GuideState(self, matcher, stop_ids)
