"""CheckpointReader: dtypes (bf16 read from the raw safetensors layout, exactly), unread names."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from paddle_llm_engine.models.weights import CheckpointReader


def write_safetensors(path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Minimal safetensors writer: {name: (dtype tag, raw array)}, so BF16 (uint16 bits) can be written."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_bf16_fp16_fp32_read_as_fp32(tmp_path):
    want = np.array([[1.5, -2.0, 0.0], [3.140625, 1e-3, -65504.0]], np.float32)
    bf16_bits = (want.view(np.uint32) >> 16).astype("<u2")  # truncation: exact for these values but 1e-3
    write_safetensors(tmp_path / "model.safetensors", {
        "a.weight": ("BF16", bf16_bits), "b.weight": ("F16", want.astype(np.float16)), "c.weight": ("F32", want)})
    r = CheckpointReader(str(tmp_path))
    a = r.get("a.weight")
    assert a.dtype == np.float32 and a.shape == (2, 3)
    np.testing.assert_array_equal(a, (bf16_bits.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_allclose(a, want, rtol=1e-2)
    np.testing.assert_allclose(r.get("b.weight"), want, rtol=1e-3)
    np.testing.assert_array_equal(r.linear("c.weight"), want.T)
    assert r.unread() == []


def test_missing_and_unread(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", {"x": ("F32", np.zeros(2, np.float32)),
                                                       "y": ("F32", np.ones(2, np.float32))})
    r = CheckpointReader(str(tmp_path))
    r.get("x")
    assert r.unread() == ["y"]
    with pytest.raises(KeyError, match="'z' missing"):
        r.get("z")
