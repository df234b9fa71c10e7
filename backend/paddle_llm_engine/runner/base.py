"""Model runner base: owns the model and the KV cache on one device, runs one engine step.

A step takes the scheduler's list of (sequence, number of new tokens), packs those tokens without
padding (decodes first, then prompt chunks), builds the attention metadata, runs the model, and
samples one token for every sequence whose step reached its last token.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import paddle

from paddle_llm_engine.config import EngineConfig, ModelConfig
from paddle_llm_engine.models import build_model
from paddle_llm_engine.models.attention_metadata import AttentionMetadata, PrefillChunk
from paddle_llm_engine.platforms import plan_for_device
from paddle_llm_engine.sampler import sample
from paddle_llm_engine.scheduler import ScheduledSeq
from paddle_llm_ops import build_opset, copy_blocks, gather_last_tokens

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """What one step produced, as data: the runner changes no sequence, block or scheduler state
    (the engine applies a StepResult in one place, LLMEngine._update_from_output).

    sampled: the scheduled entries that produced a token, in order; token_ids: [len(sampled)] int64;
    logprobs: per sampled entry (chosen token's logprob, [(token id, logprob)] top alternatives),
    (0.0, []) where none were asked; logits: [len(sampled), V] fp32 when requested (tests).
    forked / fork_token_ids / fork_logprobs: the first tokens of the sequences forked this step
    (ScheduledSeq.forks of the sampled entries, in order), each drawn with its own RNG from its
    parent's logits row."""

    sampled: list[ScheduledSeq]
    token_ids: np.ndarray
    logprobs: list = None
    logits: np.ndarray | None = None
    forked: list = field(default_factory=list)
    fork_token_ids: np.ndarray | None = None
    fork_logprobs: list = field(default_factory=list)


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class ModelRunnerBase:
    """Device-independent runner. Subclasses set the place up (setup_device) and say how much memory
    it has left (available_memory_bytes); the platform layer's plan (self.plan) fixes the compute
    dtype, the KV-cache dtype and the kernels (self.ops) for the place.

    Raises PlatformError for a dtype / kernel the place cannot run, ValueError for a KV cache that
    cannot hold one sequence, RuntimeError naming the KV settings when the device cannot allocate
    the cache."""

    def __init__(self, engine_config: EngineConfig, model_config: ModelConfig, device: str):
        self.config = engine_config
        self.model_config = model_config
        self.device = device
        self.block_size = engine_config.block_size
        self.setup_device()
        self.plan = plan_for_device(device, engine_config.dtype, engine_config.kv_cache_dtype,
                                    engine_config.kernels, engine_config.quantization)
        gather = self.plan.kv_gather_dtype if self.plan.kv_gather_dtype != self.plan.kv_cache_dtype else None
        self.ops = build_opset(fused_rms_norm=self.plan.kernels.get("fused_rms_norm", False),
                               kv_gather_dtype=gather, fused_moe=self.plan.kernels.get("fused_moe", False),
                               cpu_isa=self.plan.cpu_isa, quantization=self.plan.quantization,
                               block_size=self.block_size)
        self.configure_kernels()
        self.model = self.make_model()
        self.model.load_weights(engine_config.model_dir)
        self.num_kv_blocks = self._num_kv_blocks()
        self.kv_caches = self._allocate_kv_cache(self.num_kv_blocks)

    # -- device hooks -------------------------------------------------------------------------
    def make_model(self):
        """The model object, weights not loaded (a tensor-parallel worker makes its shard's model)."""
        return build_model(self.model_config, self.ops, self.plan.dtype)

    def setup_device(self) -> None:
        paddle.set_device(self.device)

    def configure_kernels(self) -> None:
        """Hook for the place's kernel settings once the plan is known (the CPU runner sets the C++
        kernels' thread count)."""

    def available_memory_bytes(self) -> int | None:
        """Memory the KV cache could take now that the weights are loaded, or None when the device
        does not tell. Subclasses ask their device."""
        return None

    def kv_budget(self) -> tuple[int, str]:
        """(bytes the KV cache may take when no explicit block count is set, where that comes from).

        kv_cache_memory_fraction > 0: that fraction of available_memory_bytes(); when the device
        does not report its memory, kv_cache_memory_bytes with a warning. Otherwise
        kv_cache_memory_bytes."""
        frac = self.config.kv_cache_memory_fraction
        fixed = self.config.kv_cache_memory_bytes
        if frac > 0:
            avail = self.available_memory_bytes()
            if avail is not None:
                return int(frac * avail), (f"kv_cache_memory_fraction {frac:g} of {avail / 2**20:.0f} MiB "
                                           f"available on {self.device} after loading the weights")
            log.warning("kv_cache_memory_fraction %g is set but %s does not report its free memory: "
                        "sizing the KV cache from kv_cache_memory_bytes (%d) instead", frac, self.device, fixed)
            return fixed, f"kv_cache_memory_bytes {fixed} (fallback: free memory unknown)"
        return fixed, f"kv_cache_memory_bytes {fixed}"

    # -- KV cache --------------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        """Bytes of K and V of all layers for one block, in the plan's kv_cache_dtype."""
        m = self.model_config
        return (2 * m.num_hidden_layers * self.block_size * m.num_key_value_heads * m.head_dim
                * _DTYPE_BYTES[self.plan.kv_cache_dtype])

    def _num_kv_blocks(self) -> int:
        """Explicit num_kv_blocks, else the memory budget (kv_budget) / bytes per block."""
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

    def _allocate_kv_cache(self, num_blocks: int):
        m = self.model_config
        shape = [m.num_key_value_heads, num_blocks * self.block_size, m.head_dim]
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
    def _slots(self, block_table: list[int], start: int, end: int) -> np.ndarray:
        pos = np.arange(start, end, dtype=np.int64)
        bt = np.asarray(block_table, dtype=np.int64)
        return bt[pos // self.block_size] * self.block_size + pos % self.block_size

    def prepare(self, scheduled: list[ScheduledSeq]):
        """Pack inputs. Returns (ordered entries, input_ids, positions, meta, last_token_rows)."""
        decodes = [s for s in scheduled if s.num_new_tokens == 1]
        prefills = [s for s in scheduled if s.num_new_tokens > 1]
        ordered = decodes + prefills
        ids, pos, slots, last_rows, sampled = [], [], [], [], []
        row = 0
        chunks = []
        for s in ordered:
            seq, start, n = s.seq, s.seq.num_computed_tokens, s.num_new_tokens
            ids.append(np.asarray(seq.token_ids[start:start + n], dtype=np.int64))
            pos.append(np.arange(start, start + n, dtype=np.int64))
            slots.append(self._slots(seq.block_table, start, start + n))
            if n > 1:
                chunks.append(PrefillChunk(row, n, start, paddle.to_tensor(
                    self._slots(seq.block_table, 0, start + n))))
            if s.samples:
                last_rows.append(row + n - 1)
                sampled.append(s)
            row += n
        meta = AttentionMetadata(slot_mapping=paddle.to_tensor(np.concatenate(slots)),
                                 num_decodes=len(decodes), prefills=chunks)
        if decodes:
            ctx = [s.seq.num_computed_tokens + 1 for s in decodes]
            if self.ops.decode_metadata == "block_tables":
                nblk = max(-(-c // self.block_size) for c in ctx)
                tables = np.zeros((len(decodes), nblk), dtype=np.int32)
                for i, (s, c) in enumerate(zip(decodes, ctx)):
                    used = -(-c // self.block_size)
                    tables[i, :used] = s.seq.block_table[:used]
                meta.decode_block_tables = paddle.to_tensor(tables)
                meta.decode_context_lens = paddle.to_tensor(np.asarray(ctx, dtype=np.int32))
            else:
                width = max(ctx)
                dslots = np.zeros((len(decodes), width), dtype=np.int64)
                mask = np.full((1, len(decodes), 1, width), -np.inf, dtype=np.float32)
                for i, (s, c) in enumerate(zip(decodes, ctx)):
                    dslots[i, :c] = self._slots(s.seq.block_table, 0, c)
                    mask[0, i, 0, :c] = 0.0
                meta.decode_slots = paddle.to_tensor(dslots)
                meta.decode_mask = paddle.to_tensor(mask)
        return (sampled, paddle.to_tensor(np.concatenate(ids)), paddle.to_tensor(np.concatenate(pos)), meta,
                np.asarray(last_rows, dtype=np.int64))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write block copies (src, dst), in every layer, before a step writes the cache."""
        copy_blocks(self.kv_caches, pairs, self.block_size, self.plan.kv_gather_dtype)

    @paddle.no_grad()
    def execute(self, scheduled: list[ScheduledSeq], return_logits: bool = False,
                copies: list[tuple[int, int]] = ()) -> StepResult:
        """Run one step and return its StepResult; no sequence state is modified here. `copies`:
        the scheduler's copy-on-write block copies, made before the step's KV writes."""
        if copies:
            self.copy_blocks(list(copies))
        sampled, input_ids, positions, meta, last_rows = self.prepare(scheduled)
        hidden = self.model.forward(input_ids, positions, meta, self.kv_caches)
        if len(last_rows) == 0:
            return StepResult([], np.empty(0, dtype=np.int64), [])
        logits = self.model.compute_logits(gather_last_tokens(hidden, paddle.to_tensor(last_rows)))
        return self.sample_step(sampled, logits.numpy(), return_logits)

    def sample_step(self, sampled: list[ScheduledSeq], logits_np: np.ndarray, return_logits: bool) -> StepResult:
        """The StepResult of a step whose sampled entries gave these logits rows ([len(sampled), V] fp32)."""
        seqs = [s.seq for s in sampled]
        forked = [c for s in sampled for c in s.forks]
        if forked:  # each forked sequence draws from its parent's row with its own RNG
            rows = list(range(len(sampled))) + [i for i, s in enumerate(sampled) for _ in s.forks]
            tokens, logprobs = sample(logits_np[rows], seqs + forked)
            k = len(sampled)
            return StepResult(sampled, tokens[:k], logprobs[:k], logits_np if return_logits else None,
                              forked, tokens[k:], logprobs[k:])
        tokens, logprobs = sample(logits_np, seqs)
        return StepResult(sampled, tokens, logprobs, logits_np if return_logits else None)
