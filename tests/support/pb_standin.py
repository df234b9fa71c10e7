"""A stand-in for Triton's Python-backend module `triton_python_backend_utils`, in two versions:

- `make(newer=False)`: what Triton 2.51 offers (no response parameters: InferenceResponse refuses
  the `parameters` keyword with TypeError);
- `make(newer=True)`: response parameters (python_backend >= 2.55).

BLS calls (InferenceRequest.exec, not decoupled: the project makes no decoupled BLS call) go to
Python functions registered per model name: `module.models[name] = fn(request) -> response`.
Client requests are `Request` objects whose sender records every (response, flags).
"""

from __future__ import annotations

import threading
import types

import numpy as np

FINAL = 1


class Tensor:
    def __init__(self, name: str, arr):
        self._name = name
        self._arr = np.asarray(arr)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._arr


class TritonError:
    INTERNAL, INVALID_ARG, UNAVAILABLE, CANCELLED = "INTERNAL", "INVALID_ARG", "UNAVAILABLE", "CANCELLED"

    def __init__(self, message: str, code: str = "INTERNAL"):
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> str:
        return self._code


class _Response:
    def __init__(self, output_tensors=None, error=None, parameters=None):
        self._tensors = list(output_tensors or [])
        self._error = error
        self.parameters = parameters

    def output_tensors(self):
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self):
        return self._error

    def output(self, name: str):
        for t in self._tensors:
            if t.name() == name:
                return t.as_numpy()
        return None


class Sender:
    def __init__(self):
        self.sent: list[tuple[object, int]] = []
        self.cancelled = False
        self.lock = threading.Lock()
        self.done = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        with self.lock:
            assert not self.done.is_set(), "send after the final response"
            self.sent.append((response, flags))
            if flags & FINAL:
                self.done.set()

    def is_cancelled(self) -> bool:
        assert not self.done.is_set(), "is_cancelled() after the final response (crashed Triton 2.51)"
        return self.cancelled

    def data(self) -> list:
        """The responses that carry tensors, in order."""
        return [r for r, _ in self.sent if r is not None and not r.has_error()]


class Request:
    """A client request to the model under test."""

    def __init__(self, inputs: dict, request_id: str = "", timeout_us: int = 0, parameters: str = "{}"):
        self._inputs = [Tensor(k, v) for k, v in inputs.items()]
        self._id = request_id
        self._timeout = timeout_us
        self._parameters = parameters
        self.sender = Sender()

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def inputs(self):
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def get_response_sender(self) -> Sender:
        return self.sender


def make(newer: bool) -> types.ModuleType:
    m = types.ModuleType("triton_python_backend_utils")
    m.models = {}
    m.calls = []  # (model name, request) of every BLS call
    m.Tensor = Tensor
    m.TritonError = TritonError
    m.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL

    if newer:
        class InferenceResponse(_Response):
            pass
    else:
        class InferenceResponse(_Response):
            def __init__(self, output_tensors=None, error=None):
                super().__init__(output_tensors, error)
    m.InferenceResponse = InferenceResponse

    class InferenceRequest:
        def __init__(self, model_name: str, inputs, requested_output_names, request_id: str = "", timeout: int = 0):
            self.model_name = model_name
            self.timeout = timeout
            self.tensors = {t.name(): t.as_numpy() for t in inputs}
            self.requested = list(requested_output_names)
            self.request_id = request_id

        def exec(self, decoupled: bool = False):
            assert not decoupled, "decoupled BLS deadlocks in Triton 2.51's Python backend"
            m.calls.append((self.model_name, self))
            return m.models[self.model_name](self)

    m.InferenceRequest = InferenceRequest

    def get_input_tensor_by_name(request, name):
        for t in request.inputs():
            if t.name() == name:
                return t
        return None

    def get_output_tensor_by_name(response, name):
        for t in response.output_tensors():
            if t.name() == name:
                return t
        return None

    m.get_input_tensor_by_name = get_input_tensor_by_name
    m.get_output_tensor_by_name = get_output_tensor_by_name
    return m
