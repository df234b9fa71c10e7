"""LLMEngine's LoRA methods (a mixin, so that engine.py keeps the request flow): the registry built
from the settings, load / unload / list, and the adapters of running and waiting sequences for
the metrics."""

from __future__ import annotations

import logging

log = logging.getLogger("paddle_llm_engine.engine")


class LoraEngineMixin:
    """Needs self.config (EngineConfig), self.model_config, self.scheduler and sets self.loras."""

    def _start_loras(self):
        """The LoraRegistry with the lora_modules loaded, or None when enable_lora is 0. Raises
        LoraError (a ValueError) naming the adapter and the field for a folder it cannot use."""
        if not self.config.enable_lora:
            return None
        from paddle_llm_engine.lora import LoraRegistry

        moe = self.model_config.moe
        registry = LoraRegistry(self.model_config, self.config.max_loras, self.config.max_lora_rank,
                                frozenset(moe.layers) if moe is not None else frozenset())
        for name, path in self.config.lora_module_entries():
            a = registry.add(name, path)
            log.info("LoRA adapter %r loaded from %s: rank %d, %d projections", name, path, a.rank, len(a.modules))
        return registry

    def _lora_registry(self):
        if self.loras is None:
            from paddle_llm_engine.lora import LoraError

            raise LoraError("enable_lora", "this model serves no LoRA adapters (enable_lora is 0)")
        return self.loras

    def add_lora(self, name: str, path: str):
        """Load the PEFT LoRA folder `path` as adapter `name` (any thread; the workers read its
        weights when a step first uses it). Returns the lora.LoraAdapter. Raises LoraError (an
        InvalidRequestError) naming the field: enable_lora (LoRA off), lora_name (the name is loaded
        from another folder), lora_path / target_modules / r / ... (lora/adapter.py read_adapter)."""
        return self._lora_registry().add(name, path)

    def remove_lora(self, name: str):
        """Unload adapter `name` (any thread): new requests for it are refused, running ones finish
        with it. Returns the unloaded LoraAdapter; LoraError (lora_name, enable_lora) otherwise."""
        return self._lora_registry().remove(name)

    def list_loras(self) -> list:
        """The loaded lora.LoraAdapter objects in load order ([] when LoRA is off)."""
        return [] if self.loras is None else self.loras.adapters()

    def _lora_stats(self) -> dict:
        """vLLM's lora_requests_info labels: the adapters of running and of waiting sequences."""
        if self.loras is None:
            return {}
        sch = self.scheduler
        return {"max_loras": self.config.max_loras,
                "lora_running": tuple(sorted({s.lora.name for s in sch.running if s.lora is not None})),
                "lora_waiting": tuple(sorted({s.lora.name for s in sch.waiting if s.lora is not None}))}
