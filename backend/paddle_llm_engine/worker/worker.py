"""The Worker: one device's share of an engine. The same class runs in the engine process (one
device) and in every tensor-parallel rank (its shard of the model).

Start-up runs in explicit steps, so that an executor can agree on the KV-cache size with other
ranks between them:
1. Worker(...): bind the process to the device (platform layer: place, kernel threads), decide the
   platform plan (dtype, KV-cache dtype, kernels, quantization), build the OpSet, build the model
   and load its weights;
2. determine_num_kv_blocks(): how many KV blocks fit (the explicit num_kv_blocks, else the memory
   budget over the bytes of one block);
3. initialize_cache(n): allocate n blocks in every layer.
Then execute(step) runs one engine Step (step.py: plain data) and returns the logits of the
sampled rows. A worker never sees a request, a Sequence or a sampler: what to sample is decided
on the engine side, from these logits.
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_engine.config import EngineConfig, ModelConfig
from paddle_llm_engine.models import build_model
from paddle_llm_engine.platforms import Device, platform_for, plan_for_device
from paddle_llm_engine.step import Step
from paddle_llm_engine.worker.inputs import pack_step
from paddle_llm_ops import copy_blocks, gather_last_tokens

log = logging.getLogger(__name__)

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class Worker:
    """The model and KV cache of one device.

    engine_config / model_config: the engine's settings and the config of the model this worker
    holds (a tensor-parallel rank's has its shard's head counts); device: where it runs;
    make_model(model_config, ops, dtype): the model object, weights not loaded (default: the whole
    model, models.build_model); ranks_on_host: processes of one engine sharing this host (CPU
    threads and memory are split between them); threads: kernel threads (default: the platform
    layer's choice from num_threads).

    Raises PlatformError for a dtype / kernel the place cannot run, ValueError for a KV cache that
    cannot hold one sequence, RuntimeError naming the KV settings when the device cannot allocate
    the cache."""

    def __init__(self, engine_config: EngineConfig, model_config: ModelConfig, device: Device | str,
                 make_model: Callable | None = None, ranks_on_host: int = 1, threads: int | None = None):
        self.config = engine_config
        self.model_config = model_config
        self.device = Device.parse(device)
        self.platform = platform_for(self.device)
        self.ranks_on_host = ranks_on_host
        self.block_size = engine_config.block_size
        chosen, threads_source = self.platform.kernel_threads_report(engine_config.num_threads, ranks_on_host)
        self.threads = threads or chosen
        log.info("%s: %d kernel threads (from %s)", self.device, self.threads,
                 threads_source if self.threads == chosen else "the caller's threads argument")
        self.platform.activate(self.device, self.threads)
        self.plan = plan_for_device(self.device, engine_config.dtype, engine_config.kv_cache_dtype,
                                    engine_config.kernels, engine_config.quantization,
                                    engine_config.quantization_group_size, engine_config.wint8_prefill_activations)
        self.ops = self.plan.opset(self.block_size)
        self.platform.configure_kernels(self.plan, self.threads)
        self.model = (make_model or build_model)(model_config, self.ops, self.plan.dtype)
        self.model.load_weights(engine_config.model_dir)
        log.info("%s: decode stack: %s", self.device, getattr(self.model, "decode_stack_info", "n/a"))
        self.thread_tuner = self._attach_thread_tuner()
        self.lora = None  # lora.weights.LoraWeights when enable_lora
        if engine_config.enable_lora:
            from paddle_llm_engine.lora.weights import LoraWeights

            self.lora = LoraWeights(self.model, engine_config.max_loras, engine_config.max_cpu_loras, self.plan.dtype)
        if engine_config.huge_pages:
            self._log_huge_pages(self.platform.use_huge_pages(self.model, "weights"))
        self.num_kv_blocks = 0
        self.kv_caches: list = []

    def _attach_thread_tuner(self):
        """A KernelThreadTuner on the model's decode stack when there is one, the C++ kernels run on
        2 or more threads and adaptive_kernel_threads is 1; else None (the count stays fixed)."""
        stack = getattr(self.model, "decode_stack", None)
        if stack is None or self.threads < 2 or not self.config.adaptive_kernel_threads:
            return None
        from paddle_llm_ops.cpu_kernels.thread_tuner import KernelThreadTuner

        stack.tuner = KernelThreadTuner(self.threads)
        log.info("%s: decode stack calls run on 1 or %d kernel threads, whichever their measured times favour "
                 "(adaptive_kernel_threads 1)", self.device, self.threads)
        return stack.tuner

    # -- KV cache ------------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        """Bytes of K and V of all layers for one block, in the plan's kv_cache_dtype."""
        m = self.model_config
        return (2 * m.num_hidden_layers * self.block_size * m.num_key_value_heads * m.head_dim
                * _DTYPE_BYTES[self.plan.kv_cache_dtype])

    def kv_budget(self) -> tuple[int, str]:
        """(bytes the KV cache may take when no explicit block count is set, where that comes from).

        kv_cache_memory_fraction > 0: that fraction of the memory the platform reports available
        (weights loaded); when the device does not report its memory, kv_cache_memory_bytes with a
        warning. Otherwise kv_cache_memory_bytes."""
        frac = self.config.kv_cache_memory_fraction
        fixed = self.config.kv_cache_memory_bytes
        if frac > 0:
            avail, where = self.platform.memory_report(self.device, self.ranks_on_host)
            if avail is not None:
                return int(frac * avail), (f"kv_cache_memory_fraction {frac:g} of {avail / 2**20:.0f} MiB "
                                           f"available on {self.device} after loading the weights, from {where}")
            log.warning("kv_cache_memory_fraction %g is set but %s does not report its free memory (%s): "
                        "sizing the KV cache from kv_cache_memory_bytes (%d) instead", frac, self.device, where, fixed)
            return fixed, f"kv_cache_memory_bytes {fixed} (fallback: free memory unknown: {where})"
        return fixed, f"kv_cache_memory_bytes {fixed}"

    def determine_num_kv_blocks(self) -> int:
        """KV blocks this device can hold: the explicit num_kv_blocks, else kv_budget() / bytes per
        block. Raises ValueError when that cannot hold one sequence of max_model_len."""
        if self.config.num_kv_blocks:
            n, source = self.config.num_kv_blocks, "num_kv_blocks"
        else:
            budget, source = self.kv_budget()
            n = budget // self.kv_bytes_per_block()
        per_seq = -(-self.config.max_model_len // self.block_size)
        if n < per_seq:
            raise ValueError(
                f"KV cache of {n} blocks x {self.block_size} tokens (from {source}) cannot hold one sequence "
                f"of max_model_len {self.config.max_model_len}: raise num_kv_blocks / kv_cache_memory_fraction / "
                f"kv_cache_memory_bytes or lower max_model_len"
            )
        log.info("KV cache: %d blocks x %d tokens = %d tokens max in flight, %.1f MiB of %s (from %s)", n,
                 self.block_size, n * self.block_size, n * self.kv_bytes_per_block() / 2**20,
                 self.plan.kv_cache_dtype, source)
        return n

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate K and V of `num_blocks` blocks in every layer, in the plan's kv_cache_dtype and the
        OpSet's kv_layout: "heads_slots" [kv_heads, blocks * block_size, head_dim] or "blocks"
        [blocks, block_size, kv_heads, head_dim] (the gcu paged kernels'). Raises RuntimeError naming
        the KV settings when the device runs out of memory."""
        self.kv_caches = self._allocate_kv_cache(num_blocks)
        self.num_kv_blocks = num_blocks
        if self.config.huge_pages:
            # advised only: collapsing a GiB of written cache now would add ~3 s to every start
            self._log_huge_pages(self.platform.use_huge_pages(self.kv_caches, "KV cache", collapse=False))

    def _log_huge_pages(self, line: str) -> None:
        if line:
            log.info("%s: huge pages: %s", self.device, line)

    def _allocate_kv_cache(self, num_blocks: int) -> list:
        m = self.model_config
        shape = [m.num_key_value_heads, num_blocks * self.block_size, m.head_dim]
        if self.ops.kv_layout == "blocks":
            shape = [num_blocks, self.block_size, m.num_key_value_heads, m.head_dim]
        dtype = self.plan.kv_cache_dtype
        caches = []
        try:
            for _ in range(m.num_hidden_layers):
                caches.append((paddle.zeros(shape, dtype=dtype), paddle.zeros(shape, dtype=dtype)))
        except (MemoryError, OSError, RuntimeError) as e:
            # A custom device reports exhaustion as OSError "(External) CustomDevice error", the CPU
            # as MemoryError / ResourceExhausted: either way the KV settings are what to change.
            size = num_blocks * self.kv_bytes_per_block() / 2**20
            done = len(caches)
            caches.clear()
            raise RuntimeError(
                f"out of memory on {self.device} allocating the KV cache: {num_blocks} blocks x {self.block_size} "
                f"tokens = {size:.0f} MiB of {dtype} (failed after {done} of {m.num_hidden_layers} layers); lower "
                f"num_kv_blocks, kv_cache_memory_fraction or kv_cache_memory_bytes "
                f"(or use kv_cache_dtype bfloat16 to halve it) [{type(e).__name__}: {str(e).splitlines()[0][:200]}]"
            ) from None
        return caches

    # -- one step --------------------------------------------------------------------------------
    @paddle.no_grad()
    def _forward_lora(self, step: Step, inputs, rows) -> paddle.Tensor:
        """forward() with the step's LoRA slots loaded and its rows' adapters applied (rows: the
        step's row_lora_slots, None when no row has an adapter). Raises
        RuntimeError when the step carries LoRA work and this worker was built without enable_lora."""
        if self.lora is None:
            raise RuntimeError("a step with LoRA adapters reached a worker built without enable_lora")
        for load in step.lora_loads:
            self.lora.load(load)
        self.model.lora_batch = self.lora.batch(rows) if rows is not None else None
        try:
            return self.model.forward(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)
        finally:
            self.model.lora_batch = None

    @paddle.no_grad()
    def execute(self, step: Step) -> np.ndarray:
        """Run one step: the copy-on-write block copies first, then the model over the step's tokens.
        Returns the logits of the sampled entries, [step.num_sampled, V] fp32 on the host, in the
        step's order (V: this worker's vocabulary columns; the whole vocabulary unless it is a
        tensor-parallel rank)."""
        if step.copies:
            copy_blocks(self.kv_caches, list(step.copies), self.block_size, self.plan.kv_gather_dtype,
                        self.ops.kv_layout)
        inputs = pack_step(step, self.block_size, self.ops.attention_metadata)
        rows = step.row_lora_slots() if self.lora is not None else None
        if step.lora_loads or rows is not None:
            hidden = self._forward_lora(step, inputs, rows)
        else:
            hidden = self.model.forward(inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)
        if len(inputs.last_rows) == 0:
            return np.empty((0, 0), dtype=np.float32)
        logits = self.model.compute_logits(gather_last_tokens(hidden, from_numpy(inputs.last_rows)))
        return logits.numpy()
