"""Read request tensors as Python values, with errors that name the tensor.

Works for both batching conventions: a model with max_batch_size > 0 receives [1, 1]-shaped
scalars, one with max_batch_size 0 receives [1]; either way a scalar input must hold exactly one
element. Dtype is checked against what the contract says (Triton already enforces the config's
dtype; this guards tensors declared with a wider type, e.g. seed as UINT64 or INT64).
"""

from __future__ import annotations

import numpy as np

from paddle_llm_engine.errors import InvalidRequestError


def _pb():
    import triton_python_backend_utils as pb_utils

    return pb_utils


def get_array(request, name: str) -> np.ndarray | None:
    t = _pb().get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def _one(name: str, arr: np.ndarray):
    if arr.size != 1:
        raise InvalidRequestError(name, f"expected one value, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def get_str(request, name: str) -> str | None:
    arr = get_array(request, name)
    if arr is None:
        return None
    v = _one(name, arr)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(name, "not valid UTF-8") from None
    return str(v)


def get_str_list(request, name: str) -> list[str] | None:
    """A STRING tensor of any shape -> its non-empty elements as str (e.g. stop_words)."""
    arr = get_array(request, name)
    if arr is None:
        return None
    out = []
    for v in arr.reshape(-1):
        s = v.decode("utf-8") if isinstance(v, bytes) else str(v)
        if s:
            out.append(s)
    return out


def _get_scalar(request, name: str, kind, kind_name: str, convert):
    """One value of numpy dtype kind `kind` (np.bool_, np.integer, np.floating) as a Python value."""
    arr = get_array(request, name)
    if arr is None:
        return None
    if not np.issubdtype(arr.dtype, kind):
        raise InvalidRequestError(name, f"expected {kind_name}, got {arr.dtype}")
    return convert(_one(name, arr))


def get_bool(request, name: str) -> bool | None:
    return _get_scalar(request, name, np.bool_, "BOOL", bool)


def get_int(request, name: str) -> int | None:
    return _get_scalar(request, name, np.integer, "an integer type", int)


def get_float(request, name: str) -> float | None:
    return _get_scalar(request, name, np.floating, "a floating type", float)
