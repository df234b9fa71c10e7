"""Read HF safetensors checkpoints into numpy arrays by parameter name."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np


def _bf16_tensors(path: Path) -> dict[str, tuple[int, list[int]]]:
    """{name: (absolute byte offset, shape)} of the BF16 tensors in one safetensors file (numpy has no
    bfloat16, so safetensors' numpy reader refuses them; they are read here from the raw layout:
    u64 little-endian header size, JSON header, data)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: (8 + n + v["data_offsets"][0], v["shape"]) for k, v in header.items()
            if k != "__metadata__" and v["dtype"] == "BF16"}


class CheckpointReader:
    """All `*.safetensors` files of a folder, read lazily by name (HF layout: Linear is [out, in]).
    fp32, fp16 and bf16 tensors are returned as fp32 (bf16 -> fp32 is exact)."""

    def __init__(self, model_dir: str):
        from safetensors import safe_open

        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {model_dir}")
        self._where: dict[str, object] = {}
        self._bf16: dict[str, tuple[Path, int, list[int]]] = {}
        self._read: set[str] = set()
        self._handles = [safe_open(str(f), framework="np") for f in files]
        for f, h in zip(files, self._handles):
            for k in h.keys():
                self._where[k] = h
            for k, (offset, shape) in _bf16_tensors(f).items():
                self._bf16[k] = (f, offset, shape)

    def get(self, name: str) -> np.ndarray:
        """fp32 array for `name`; raises KeyError naming the missing tensor."""
        if name not in self._where:
            raise KeyError(f"tensor {name!r} missing from the checkpoint")
        self._read.add(name)
        if name in self._bf16:
            path, offset, shape = self._bf16[name]
            raw = np.fromfile(path, dtype="<u2", count=int(np.prod(shape)), offset=offset)
            return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        return np.asarray(self._where[name].get_tensor(name), dtype=np.float32)

    def unread(self) -> list[str]:
        """Names never fetched with get()/linear(), sorted: what a model left unused."""
        return sorted(set(self._where) - self._read)

    def linear(self, name: str) -> np.ndarray:
        """An HF Linear weight [out, in] as the [in, out] matrix that x @ W expects."""
        return np.ascontiguousarray(self.get(name).T)
