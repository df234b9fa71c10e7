"""Client helpers for the end-to-end tests: the way users of Triton's TensorRT-LLM ensemble and of
Triton's vLLM backend call a server, with tritonclient (gRPC streaming) and plain HTTP (`requests`).

- `ensemble_inputs(...)`: TensorRT-LLM tensor names, shape [1, 1] (one request of the ensemble's max_batch_size 8).
- `llm_inputs(...)`: vLLM-backend contract, shape [1] (llm max_batch_size 0), sampling_parameters
  as a JSON string whose values are strings, as in Triton's vllm_backend samples.
- `grpc_stream(...)`: one request on a gRPC bidirectional stream; collects every response until the
  one flagged `triton_final_response` (or an error), with a timeout.
- `scrape_metrics(...)`: Prometheus text -> {(name, frozenset(labels)): value}.
HTTP (generate, generate_stream, readiness) is in http_clients.py.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import re
import threading
import time
from typing import Iterable

import numpy as np
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

DEFAULT_TIMEOUT_S = 120.0

_NP_TO_TRITON = {
    np.object_: "BYTES",
    np.int32: "INT32",
    np.uint32: "UINT32",
    np.int64: "INT64",
    np.uint64: "UINT64",
    np.float32: "FP32",
    np.bool_: "BOOL",
}

_ENSEMBLE_DTYPES = {
    "text_input": np.object_,
    "max_tokens": np.int32,
    "stream": np.bool_,
    "stop_words": np.object_,
    "bad_words": np.object_,
    "end_id": np.int32,
    "pad_id": np.int32,
    "top_k": np.int32,
    "top_p": np.float32,
    "temperature": np.float32,
    "repetition_penalty": np.float32,
    "presence_penalty": np.float32,
    "frequency_penalty": np.float32,
    "length_penalty": np.float32,
    "min_tokens": np.int32,
    "min_length": np.int32,
    "seed": np.uint64,
    "random_seed": np.uint64,
    "exclude_input_in_output": np.bool_,
    "return_log_probs": np.bool_,
    "beam_width": np.int32,
    "num_return_sequences": np.int32,
    "apply_chat_template": np.bool_,
    "guided_decoding_guide_type": np.object_,
    "guided_decoding_guide": np.object_,
    "reasoning_max_tokens": np.int32,
    "thinking_token_budget": np.int32,
}

LLM_FLAGS = ("exclude_input_in_output", "return_finish_reason", "return_num_input_tokens",
             "return_num_output_tokens", "return_logprobs", "return_cumulative_logprob", "return_reasoning")


def _tensor(name: str, arr: np.ndarray) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(arr.shape), _NP_TO_TRITON[arr.dtype.type])
    t.set_data_from_numpy(arr)
    return t


def _encode(value, dtype):
    if dtype is np.object_:
        return value.encode("utf-8") if isinstance(value, str) else value
    return value


def ensemble_inputs(text: str, **params) -> list[grpcclient.InferInput]:
    """Inputs for `ensemble` (TensorRT-LLM names), every tensor [1, 1]; list values (stop_words,
    bad_words) become [1, N]. None values are left out."""
    inputs = [_tensor("text_input", np.array([[text.encode("utf-8")]], dtype=np.object_))]
    for name, value in params.items():
        if value is None:
            continue
        dtype = _ENSEMBLE_DTYPES[name]
        if isinstance(value, (list, tuple)):
            arr = np.array([[_encode(v, dtype) for v in value]], dtype=dtype)
        else:
            arr = np.array([[_encode(value, dtype)]], dtype=dtype)
        inputs.append(_tensor(name, arr))
    return inputs


def sampling_json(params: dict | None) -> str:
    """vLLM-backend style: every value sent as a string ({"temperature": "0"}), lists kept."""
    if not params:
        return "{}"
    out = {}
    for k, v in params.items():
        if isinstance(v, (list, tuple)):
            out[k] = list(v)
        elif isinstance(v, bool):
            out[k] = "true" if v else "false"
        else:
            out[k] = str(v)
    return json.dumps(out)


def llm_inputs(text: str, stream: bool = True, sampling_parameters: dict | str | None = None,
               **flags) -> list[grpcclient.InferInput]:
    """Inputs for `llm` (Triton vLLM backend contract), every tensor shape [1].

    sampling_parameters: a dict (values stringified, see `sampling_json`) or a raw JSON string.
    flags: exclude_input_in_output / return_* booleans (None: not sent)."""
    inputs = [
        _tensor("text_input", np.array([text.encode("utf-8")], dtype=np.object_)),
        _tensor("stream", np.array([stream], dtype=np.bool_)),
    ]
    if sampling_parameters is not None:
        sp = sampling_parameters if isinstance(sampling_parameters, str) else sampling_json(sampling_parameters)
        inputs.append(_tensor("sampling_parameters", np.array([sp.encode("utf-8")], dtype=np.object_)))
    for name, value in flags.items():
        if name not in LLM_FLAGS:
            raise KeyError(f"unknown llm flag {name}")
        if value is None:
            continue
        inputs.append(_tensor(name, np.array([bool(value)], dtype=np.bool_)))
    return inputs


@dataclasses.dataclass
class StreamResult:
    """All responses of one gRPC streamed request."""

    responses: list  # tritonclient.grpc.InferResult, in arrival order (the empty final one excluded)
    error: InferenceServerException | None
    elapsed_s: float
    final_seen: bool

    def texts(self) -> list[str]:
        return [decode_str(r, "text_output") for r in self.responses if r.as_numpy("text_output") is not None]

    @property
    def text(self) -> str:
        return "".join(self.texts())

    def last(self, name: str):
        """`name` output of the last response that carries it (None when none does)."""
        for r in reversed(self.responses):
            arr = r.as_numpy(name)
            if arr is not None:
                return arr
        return None

    def all(self, name: str) -> list:
        return [r.as_numpy(name) for r in self.responses if r.as_numpy(name) is not None]

    def raise_for_error(self) -> "StreamResult":
        if self.error is not None:
            raise AssertionError(f"request failed: {self.error}")
        if not self.final_seen:
            raise AssertionError("no final response")
        return self


def decode_str(result, name: str) -> str:
    arr = result.as_numpy(name)
    v = arr.reshape(-1)[0]
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def is_final(result) -> bool:
    p = result.get_response().parameters.get("triton_final_response")
    return p is not None and p.bool_param


class GrpcStream:
    """One open gRPC stream for a single request; lets a test read responses one by one and cancel."""

    def __init__(self, url: str, model: str, inputs, timeout: float = DEFAULT_TIMEOUT_S,
                 request_timeout_us: int | None = None):
        """timeout: this client's wait for the whole stream (seconds); request_timeout_us: Triton's
        request timeout (tritonclient `timeout=`, microseconds), which the server enforces."""
        self.timeout = timeout
        self._q: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self._q.put((result, error)))
        self.t0 = time.monotonic()
        self.client.async_stream_infer(model, inputs, enable_empty_final_response=True, timeout=request_timeout_us)
        self._closed = False

    def next(self, timeout: float | None = None):
        """(result, error) of the next response; raises TimeoutError."""
        try:
            return self._q.get(timeout=self.timeout if timeout is None else timeout)
        except queue.Empty:
            raise TimeoutError(f"no response within {self.timeout if timeout is None else timeout} s") from None

    def collect(self) -> StreamResult:
        deadline = self.t0 + self.timeout
        responses, error, final = [], None, False
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"stream not finished within {self.timeout} s "
                                       f"({len(responses)} responses so far)")
                result, err = self.next(timeout=left)
                if err is not None:
                    error = err
                    break
                fin = is_final(result)
                # The empty final response (enable_empty_final_response) has no outputs.
                if result.get_response().outputs:
                    responses.append(result)
                if fin:
                    final = True
                    break
        finally:
            self.close()
        return StreamResult(responses, error, time.monotonic() - self.t0, final)

    def cancel(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.stop_stream(cancel_requests=True)
            self.client.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.stop_stream()
            self.client.close()


def grpc_stream(url: str, model: str, inputs, timeout: float = DEFAULT_TIMEOUT_S) -> StreamResult:
    """Send one request on a new gRPC stream and collect all of its responses."""
    return GrpcStream(url, model, inputs, timeout).collect()


def ensemble_stream(url: str, text: str, timeout: float = DEFAULT_TIMEOUT_S, **params) -> StreamResult:
    return grpc_stream(url, "ensemble", ensemble_inputs(text, **params), timeout)


def llm_stream(url: str, text: str, stream: bool = True, sampling_parameters=None,
               timeout: float = DEFAULT_TIMEOUT_S, **flags) -> StreamResult:
    return grpc_stream(url, "llm", llm_inputs(text, stream, sampling_parameters, **flags), timeout)


def run_concurrently(fns: Iterable, timeout: float = DEFAULT_TIMEOUT_S) -> list:
    """Call every fn() on its own thread at once; return their results in order (re-raise errors)."""
    fns = list(fns)
    results: list = [None] * len(fns)
    errors: list = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def run(i, fn):
        try:
            barrier.wait(timeout=10)
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    for i, e in enumerate(errors):
        if e is not None:
            raise e
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"concurrent requests not finished within {timeout} s")
    return results


# -- metrics -------------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclasses.dataclass
class Metrics:
    text: str
    samples: dict  # (name, frozenset(label items)) -> float
    types: dict    # family name -> "counter" / "gauge" / "histogram"

    def find(self, name: str, **labels) -> list[tuple[dict, float]]:
        out = []
        for (n, lbl), v in self.samples.items():
            if n != name:
                continue
            d = dict(lbl)
            if all(d.get(k) == str(val) for k, val in labels.items()):
                out.append((d, v))
        return out

    def value(self, name: str, **labels) -> float:
        """Sum of the samples of `name` matching labels; 0.0 when there is none."""
        return sum(v for _, v in self.find(name, **labels))


def scrape_metrics(metrics_url: str, timeout: float = 10.0) -> Metrics:
    r = requests.get(metrics_url, timeout=timeout)
    r.raise_for_status()
    samples, types = {}, {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE"):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return Metrics(r.text, samples, types)
