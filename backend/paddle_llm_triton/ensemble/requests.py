"""The state of one `ensemble` request while pipeline.py relays it, and the helpers that
build its responses: ClientRequest (the client's sender, guarded), Flight (one engine request of a row),
Row (what preprocessing made of a row)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


@dataclass
class ClientRequest:
    """One client request: its response sender and the llm requests (flights) of its rows.

    Every use of `sender` holds `lock`, and nothing touches it after the FINAL send (`done`): in
    Triton 2.51, is_cancelled() on a sender whose final response is already out crashed
    tritonserver (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled), and the watcher thread
    polls while the row threads send. `remaining`: sequences (over all rows) whose last response
    is not sent yet; the one that brings it to 0 is sent FINAL."""

    client_id: str
    sender: object
    remaining: int = 1
    cancelled: bool = False
    done: bool = False
    flights: list = field(default_factory=list)
    live_flights: int = 0
    timeout_us: int = 0  # the client's request timeout (0 = none), passed on to its llm requests
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, response=None, ends_sequence: bool = False, final: bool = False) -> bool:
        """Send unless the final response is out; the response is FINAL when it ends the last
        sequence (or `final`). False when nothing was sent."""
        pb = _pb()
        with self.lock:
            if self.done:
                return False
            if ends_sequence:
                self.remaining -= 1
            final = final or self.remaining <= 0
            self.done = final
            self.sender.send(response, flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
            return True

    def poll_cancelled(self) -> bool:
        """True the first time the client's cancellation is seen (never after the final send)."""
        with self.lock:
            if self.done or self.cancelled:
                return False
            self.cancelled = bool(self.sender.is_cancelled())
            return self.cancelled


@dataclass
class Flight:
    """One engine request in flight (a row of a client request)."""

    client: ClientRequest
    inner_id: str                       # this pipeline's id of the row (logs)
    stream: object = None               # its engine_channel.client.ChannelStream once opened
    ended: bool = False
    first_stop_at: float | None = None  # time.monotonic() of the first abort sent


@dataclass
class Row:
    """What preprocessing made of one row, and what the client asked for it."""

    index: int
    pre: dict                 # preprocessing output name -> numpy
    text: np.ndarray          # the row's text_input
    n: int                    # num_return_sequences
    perf: bool
    num_input_tokens: bool
    num_output_tokens: bool
    lora: dict | None = None  # the generate frame's "lora" (steps.lora_request), None: the base model


class StepError(Exception):
    """A step of the pipeline failed or refused the request; `code` is the pb_utils.TritonError code
    the client's error response carries."""

    def __init__(self, message: str, code):
        super().__init__(message)
        self.code = code


def batch_row(arr: np.ndarray, b: int, batch: int) -> np.ndarray:
    """Row b of a batched input ([B, ...] -> [1, ...]); an input without that batch dim as is."""
    return arr[b:b + 1] if batch > 1 and arr.ndim >= 1 and arr.shape[0] == batch else arr


def as_text(v) -> str:
    """A BYTES tensor element (bytes, UTF-8, undecodable bytes replaced) or any value -> str."""
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def bls_error_code(err):
    """The TritonError code of a BLS error (INTERNAL when the stub does not expose it)."""
    pb = _pb()
    try:
        return err.code()
    except Exception:
        return pb.TritonError.INTERNAL


# Response parameters a Triton ensemble attaches to every response (HTTP generate shows them as JSON
# fields); sent too so that the JSON clients see stays the same. The response that ends a sequence
# also names its finish_reason (stop / length / abort), which TensorRT-LLM's tensors do not carry.
# Python backends before 2.55 have no response parameters: then none are sent.
_SEQUENCE_PARAMETERS = {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
_parameters_supported: bool | None = None


def ensemble_response(tensors: list, finish_reason: str = ""):
    """A pb_utils.InferenceResponse of `tensors` with the sequence parameters a Triton ensemble sends
    (and finish_reason when it ends a sequence); without them on a Python backend that has none."""
    global _parameters_supported
    pb = _pb()
    if _parameters_supported is not False:
        params = dict(_SEQUENCE_PARAMETERS)
        if finish_reason:
            params["finish_reason"] = finish_reason
        try:
            r = pb.InferenceResponse(output_tensors=tensors, parameters=params)
            _parameters_supported = True
            return r
        except TypeError:
            _parameters_supported = False
            log.info("this Python backend has no response parameters; sequence_* / finish_reason not sent")
    return pb.InferenceResponse(output_tensors=tensors)
