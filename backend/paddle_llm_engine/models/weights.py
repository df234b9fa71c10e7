"""Read HF safetensors checkpoints into numpy arrays by parameter name."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class CheckpointReader:
    """All `*.safetensors` files of a folder, read lazily by name (HF layout: Linear is [out, in])."""

    def __init__(self, model_dir: str):
        from safetensors import safe_open

        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {model_dir}")
        self._where: dict[str, object] = {}
        self._handles = [safe_open(str(f), framework="np") for f in files]
        for h in self._handles:
            for k in h.keys():
                self._where[k] = h

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        """fp32 array for `name`; raises KeyError naming the missing tensor."""
        if name not in self._where:
            raise KeyError(f"tensor {name!r} missing from the checkpoint")
        return np.asarray(self._where[name].get_tensor(name), dtype=np.float32)

    def linear(self, name: str) -> np.ndarray:
        """An HF Linear weight [out, in] as the [in, out] matrix that x @ W expects."""
        return np.ascontiguousarray(self.get(name).T)
