"""numpy -> Paddle tensor without Paddle 3.3's per-call leak.

Every eager tensor built from a numpy array (`paddle.to_tensor`, `paddle.Tensor(ndarray)`, the
eager Tensor constructor, `paddle.from_dlpack`) keeps 56-104 bytes of Python objects forever,
measured with tracemalloc on paddlepaddle 3.3.1 (tests/unit/test_host_tensor.py measures it again).
An engine step builds ~10-30 such tensors (input ids, positions, slot mapping, block tables, masks),
so a serving process grew ~1 MB per minute under load, linear and unbounded. An empty tensor filled
with `set_value` allocates nothing that outlives it and is no slower (about 13 us vs. 15 us for a
64-element array). Every numpy -> tensor conversion of the engine and its ops goes through here.
"""

from __future__ import annotations

import numpy as np
import paddle


def from_numpy(arr, dtype=None) -> paddle.Tensor:
    """A new tensor on the current default place holding a copy of `arr`.

    arr: numpy array (any shape, 0-d included; non-contiguous is copied to contiguous first) or
    anything np.asarray accepts; dtype: optional numpy dtype to convert to first. Returns a tensor of
    the same shape and dtype (bool, int8, uint8, int32, int64, float16, float32, float64).
    Raises TypeError for a dtype Paddle has no tensor type for (e.g. object, str)."""
    # np.require, not np.ascontiguousarray: the latter turns a 0-d array into shape [1]
    a = np.require(np.asarray(arr, dtype=dtype), requirements="C")
    if a.dtype.kind in "OUSV":
        raise TypeError(f"no Paddle tensor type for numpy dtype {a.dtype}")
    if a.ndim == 0:  # set_value takes a 0-d array as shape [1]
        t = paddle.empty([1], dtype=a.dtype)
        t.set_value(a.reshape(1))
        return t.reshape([])
    t = paddle.empty(list(a.shape), dtype=a.dtype)
    t.set_value(a)
    return t
