"""The engine's LoRA adapters: which are loaded (by name, any thread) and which sit in the workers'
max_loras device slots (engine thread, per step).

Every load gets a new lora_id (1, 2, ...), never reused: a name unloaded and loaded again from
another folder is another adapter, so no KV block, slot or worker copy of the old weights is ever
taken for the new one. Requests hold the adapter they were accepted with; unloading a name refuses
new requests for it while the running ones finish on their weights.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.lora.adapter import LoraAdapter, LoraError, read_adapter


@dataclass(frozen=True)
class LoraLoad:
    """A worker instruction carried by a Step: put `adapter` (checked by the engine; its lora_id,
    folder and modules) into device slot `slot` before running the step (the slot's previous adapter
    is dropped from the device)."""

    slot: int
    adapter: LoraAdapter


class LoraRegistry:
    """Loaded adapters by name (thread-safe) and the slot assignment (engine thread only).

    model: the base model's config (adapters are checked against it); max_loras: device slots, i.e.
    distinct adapters one step may use; max_lora_rank: the largest rank accepted; moe_layers: layers
    whose MLP is a mixture of experts."""

    def __init__(self, model: ModelConfig, max_loras: int, max_lora_rank: int,
                 moe_layers: frozenset[int] = frozenset()):
        self.model = model
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.moe_layers = moe_layers
        self._lock = threading.Lock()
        self._by_name: dict[str, LoraAdapter] = {}
        self._next_id = 1
        # slot assignment (engine thread): lora_id -> slot, least recently used first
        self._resident: OrderedDict[int, int] = OrderedDict()
        self._free_slots = list(range(max_loras))

    def add(self, name: str, path: str) -> LoraAdapter:
        """Check the PEFT folder `path` (adapter.read_adapter) and load it as `name`; returns the
        adapter (with its lora_id). Loading a name again with the same folder returns the loaded
        one. Raises LoraError: a name already loaded from another folder (lora_name), or what
        read_adapter raises."""
        adapter = read_adapter(name, path, self.model, self.max_lora_rank, self.moe_layers)
        with self._lock:
            old = self._by_name.get(name)
            if old is not None:
                if old.path == adapter.path:
                    return old
                raise LoraError("lora_name", f"LoRA adapter {name!r} is already loaded from {old.path}; unload it "
                                             f"first to load it from {adapter.path}")
            adapter = replace(adapter, lora_id=self._next_id)
            self._next_id += 1
            self._by_name[name] = adapter
            return adapter

    def remove(self, name: str) -> LoraAdapter:
        """Unload `name`: new requests for it are refused; running ones finish. Raises LoraError
        (lora_name) for a name not loaded."""
        with self._lock:
            adapter = self._by_name.pop(name, None)
        if adapter is None:
            raise LoraError("lora_name", f"LoRA adapter {name!r} is not loaded ({self._loaded_text()})")
        return adapter

    def get(self, name: str) -> LoraAdapter:
        """The adapter loaded as `name`; LoraError (lora_name) naming the loaded ones otherwise."""
        with self._lock:
            adapter = self._by_name.get(name)
        if adapter is None:
            raise LoraError("lora_name", f"unknown LoRA adapter {name!r} ({self._loaded_text()})")
        return adapter

    def adapters(self) -> list[LoraAdapter]:
        """The loaded adapters, in load order."""
        with self._lock:
            return sorted(self._by_name.values(), key=lambda a: a.lora_id)

    def _loaded_text(self) -> str:
        with self._lock:
            names = sorted(self._by_name)
        return f"loaded: {', '.join(names)}" if names else "none is loaded"

    # -- device slots (engine thread) ---------------------------------------------------------
    def assign_slots(self, adapters: list[LoraAdapter]) -> tuple[dict[int, int], tuple[LoraLoad, ...]]:
        """Slots for the adapters of one step ({lora_id: slot}) and the loads the workers must do
        first: a resident adapter keeps its slot; another takes a free slot, else the least recently
        used slot of an adapter not in this step. Raises RuntimeError when the step has more
        distinct adapters than max_loras (the scheduler admits no such step)."""
        wanted = {a.lora_id: a for a in adapters}
        if len(wanted) > self.max_loras:
            raise RuntimeError(f"a step with {len(wanted)} LoRA adapters exceeds max_loras {self.max_loras}")
        slots, loads = {}, []
        for lid in wanted:
            if lid in self._resident:
                self._resident.move_to_end(lid)
                slots[lid] = self._resident[lid]
        for lid, adapter in wanted.items():
            if lid in slots:
                continue
            if self._free_slots:
                slot = self._free_slots.pop(0)
            else:
                victim = next(v for v in self._resident if v not in wanted)
                slot = self._resident.pop(victim)
            self._resident[lid] = slot
            slots[lid] = slot
            loads.append(LoraLoad(slot, adapter))
        return slots, tuple(loads)

    def resident(self) -> dict[int, int]:
        """{lora_id: slot} of the adapters on the device now (least recently used first)."""
        return dict(self._resident)
