"""Request tensors -> Python values (paddle_llm_triton/tensors.py), with a stand-in for Triton's
pb_utils: both batching conventions, dtype checks and errors that name the tensor."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from paddle_llm_engine.errors import InvalidRequestError
from paddle_llm_triton import tensors as T


class _Tensor:
    def __init__(self, arr):
        self._arr = arr

    def as_numpy(self):
        return self._arr


@pytest.fixture(autouse=True)
def fake_pb_utils(monkeypatch):
    pb = types.ModuleType("triton_python_backend_utils")
    pb.get_input_tensor_by_name = lambda request, name: (_Tensor(request[name]) if name in request else None)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)


def test_scalars_in_both_shapes():
    req = {"a": np.array([[True]]), "b": np.array([7], np.int32), "c": np.array([[0.5]], np.float32),
           "s": np.array([b"hi"], np.object_), "seed": np.array([[2**63]], np.uint64)}
    assert T.get_bool(req, "a") is True
    assert T.get_int(req, "b") == 7 and T.get_int(req, "seed") == 2**63
    assert T.get_float(req, "c") == 0.5
    assert T.get_str(req, "s") == "hi"
    assert T.get_int(req, "missing") is None and T.get_str_list(req, "missing") is None


@pytest.mark.parametrize("getter, arr, text", [
    (T.get_bool, np.array([1], np.int32), "expected BOOL"),
    (T.get_int, np.array([1.0], np.float32), "expected an integer type"),
    (T.get_float, np.array([1], np.int32), "expected a floating type"),
    (T.get_int, np.array([1, 2], np.int32), "expected one value"),
    (T.get_str, np.array([b"\xff"], np.object_), "not valid UTF-8"),
])
def test_bad_tensors_name_the_tensor(getter, arr, text):
    with pytest.raises(InvalidRequestError) as ei:
        getter({"x": arr}, "x")
    assert ei.value.field == "x" and text in str(ei.value)


def test_string_list_drops_empty_elements():
    assert T.get_str_list({"w": np.array([[b"a", b"", b"b"]], np.object_)}, "w") == ["a", "b"]
