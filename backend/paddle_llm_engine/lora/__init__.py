"""Multi-LoRA: many PEFT LoRA adapters of one base model served together, rows of different
adapters (and none) in one step.

adapter.py reads and checks a PEFT folder against the base model; registry.py keeps the loaded
adapters by name and assigns the max_loras device slots per step (engine side); weights.py holds a
worker's prepared adapter weights and applies a step's deltas, grouped by adapter, through the
OpSet's lora_apply.
"""

from paddle_llm_engine.lora.adapter import LoraAdapter, LoraError, read_adapter
from paddle_llm_engine.lora.registry import LoraLoad, LoraRegistry

__all__ = ["LoraAdapter", "LoraError", "LoraLoad", "LoraRegistry", "read_adapter"]
