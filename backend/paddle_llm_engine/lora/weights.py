"""A worker's LoRA weights: every adapter it was asked for, prepared once for its model (host
memory, least recently used dropped past max_cpu_loras), and the max_loras device slots a step's
rows point at; plus the per-step batch the model's linears apply.

Prepared form, per (layer, fused linear): A [in, R] and B [R, out] with the scale folded into B;
a fused linear's parts (q | k | v, gate | up) stack their A's side by side and put each B in its
own rows and its part's output columns (block-diagonal), so one pair of matmuls serves the fused
projection. Tensor parallel: the model's shard_tensor cuts B's output rows of a column-parallel
projection (q/k/v, gate/up) and A's input columns of a row-parallel one (o, down) as it cuts the
base weight, so the rank's partial output plus its partial delta sum to the whole over the ranks.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import paddle

from paddle_llm_ops.host_tensor import from_numpy
from paddle_llm_engine.lora.adapter import ATTENTION_MODULES, LoraPair
from paddle_llm_engine.lora.registry import LoraLoad

_COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def _fused_offsets(model, layer: int) -> dict[str, tuple[str, int]]:
    """{module: (fused linear, first output column)} on this model (a rank's head counts)."""
    d = model.head_dim
    nq, nkv = model.num_heads * d, model.num_kv_heads * d
    out = {"q_proj": ("qkv", 0), "k_proj": ("qkv", nq), "v_proj": ("qkv", nq + nkv), "o_proj": ("o", 0),
           "down_proj": ("down", 0)}
    gate_up = getattr(model.layers[layer].mlp, "gate_up", None)
    if gate_up is not None:
        inter = gate_up.out_features // 2
        out.update(gate_proj=("gate_up", 0), up_proj=("gate_up", inter))
    return out


def prepare_pairs(model, pairs: list[LoraPair], modules: dict | None = None
                  ) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """{(layer, fused linear): (A [in, R], B [R, out]) fp32} of one adapter for `model` (its shard
    under tensor parallel; q/k rows permuted as the model permutes them for interleaved rotary).
    modules: a dict to fill with the per-projection form {(layer, module): (A^T [r, in], B^T [r, n],
    first output column in the fused linear)} (the CPU decode stack's, which skips the zero blocks).
    Raises ValueError for a module the model's layer does not have as a dense projection."""
    from paddle_llm_ops import interleaved_to_half_order

    d = model.head_dim
    order = interleaved_to_half_order(d) if model.arch.rope_interleaved else None
    parts: dict[tuple[int, str], list] = {}
    for p in pairs:
        sub = "self_attn" if p.module in ATTENTION_MODULES else "mlp"
        base = f"model.layers.{p.layer}.{sub}.{p.module}.weight"
        a, b = p.a, p.b * np.float32(p.scale)
        if p.module in _COLUMN_PARALLEL:
            b = model.shard_tensor(base, b)  # [out_rank, r]
            if order is not None and p.module in ("q_proj", "k_proj"):
                b = b.reshape(-1, d, b.shape[1])[:, order].reshape(b.shape)
        else:
            a = model.shard_tensor(base, a)  # [r, in_rank]
        offsets = _fused_offsets(model, p.layer)
        if p.module not in offsets:
            raise ValueError(f"layer {p.layer} has no dense {p.module}")
        linear, col = offsets[p.module]
        parts.setdefault((p.layer, linear), []).append((col, a, b))
        if modules is not None:
            modules[(p.layer, p.module)] = (np.ascontiguousarray(a), np.ascontiguousarray(b.T), col)
    out = {}
    for (layer, linear), items in parts.items():
        lin = getattr(model.layers[layer], linear, None) or getattr(model.layers[layer].mlp, linear)
        rank_total = sum(a.shape[0] for _, a, _ in items)
        a_cat = np.zeros((lin.in_features, rank_total), np.float32)
        b_bd = np.zeros((rank_total, lin.out_features), np.float32)
        r0 = 0
        for col, a, b in items:
            r = a.shape[0]
            a_cat[:, r0:r0 + r] = a.T
            b_bd[r0:r0 + r, col:col + b.shape[0]] = b.T
            r0 += r
        out[(layer, linear)] = (a_cat, b_bd)
    return out


class LoraWeights:
    """The worker's adapters: host copies (prepared, by lora_id, at most max_cpu_loras kept, least
    recently used dropped first; a dropped one is read from its folder again when needed) and the
    device slots. model: the worker's model; dtype: its compute dtype."""

    def __init__(self, model, max_loras: int, max_cpu_loras: int, dtype: str):
        self.model = model
        self.dtype = dtype
        self.max_cpu_loras = max(max_cpu_loras, 1)
        self.host: OrderedDict[int, dict] = OrderedDict()
        self.slots: list[dict | None] = [None] * max_loras  # slot -> {(layer, linear): (A, B)} tensors
        self.slot_ids: list[int] = [0] * max_loras
        self.num_reads = 0  # adapter folders read (host misses)
        # The CPU decode stack's view of the slots ([r, K] / [N, r] fp32 factors), when the model has one
        self.stack_table = None
        if getattr(model, "decode_stack", None) is not None:
            from paddle_llm_ops.cpu_kernels.decode_stack import LoraTable

            self.stack_table = LoraTable(len(model.layers), max_loras)

    def _host_copy(self, load: LoraLoad) -> tuple[dict, dict | None]:
        if load.adapter.lora_id in self.host:
            self.host.move_to_end(load.adapter.lora_id)
            return self.host[load.adapter.lora_id]
        modules = {} if self.stack_table is not None else None
        prepared = (prepare_pairs(self.model, load.adapter.load_pairs(), modules), modules)
        self.num_reads += 1
        self.host[load.adapter.lora_id] = prepared
        while len(self.host) > self.max_cpu_loras:
            self.host.popitem(last=False)
        return prepared

    def load(self, load: LoraLoad) -> None:
        """Put adapter load.lora_id in device slot load.slot (from the host copy, read first if
        needed)."""
        prepared, modules = self._host_copy(load)

        def dev(a: np.ndarray) -> paddle.Tensor:
            t = from_numpy(np.ascontiguousarray(a))
            if self.dtype != "float32":
                t = t.astype(self.dtype)
            t.stop_gradient = True
            return t

        self.slots[load.slot] = {k: (dev(a), dev(b)) for k, (a, b) in prepared.items()}
        self.slot_ids[load.slot] = load.adapter.lora_id
        if self.stack_table is not None:
            self.stack_table.set_slot(load.slot, {k: (dev(a), dev(b), col) for k, (a, b, col) in modules.items()})

    def batch(self, row_slots: np.ndarray) -> "LoraBatch | None":
        """The LoraBatch of a step whose token rows use slots row_slots [T] int (-1: no adapter);
        None when no row has an adapter."""
        if not (row_slots >= 0).any():
            return None
        return LoraBatch(self, row_slots)


# Rows are sliced in runs (one run: consecutive rows of one adapter) while the runs are few and
# long, as a step's prompt chunks are; else gathered per adapter (decode rows, one per sequence).
MAX_RUNS = 64
MIN_MEAN_RUN = 8


class LoraBatch:
    """One step's rows grouped by adapter; apply(layer, linear, x, y) adds the deltas of the rows
    whose adapter adapts that linear (ops.lora_apply)."""

    def __init__(self, weights: LoraWeights, row_slots: np.ndarray):
        self.weights = weights
        self.row_slots = row_slots
        self.num_rows = len(row_slots)
        used = sorted(int(s) for s in np.unique(row_slots) if s >= 0)
        self.rows = {s: np.flatnonzero(row_slots == s).astype(np.int64) for s in used}
        edges = np.flatnonzero(np.diff(row_slots)) + 1
        starts, stops = np.concatenate([[0], edges]), np.concatenate([edges, [self.num_rows]])
        self.runs = [(int(a), int(b), int(row_slots[a])) for a, b in zip(starts, stops) if row_slots[a] >= 0]
        self.sliced = len(self.runs) <= MAX_RUNS and sum(b - a for a, b, _ in self.runs) >= MIN_MEAN_RUN * len(self.runs)
        self._rows_t: dict[int, paddle.Tensor] = {}
        self._gathers: dict[tuple[int, ...], paddle.Tensor | None] = {}
        self._stack_rows = None

    def stack_inputs(self) -> tuple | None:
        """(rows [T] int64 slots, LoraTable of the per-projection factors) for the CPU decode stack,
        or None when the worker keeps no stack table (the model has no decode stack)."""
        if self.weights.stack_table is None:
            return None
        if self._stack_rows is None:
            self._stack_rows = from_numpy(self.row_slots.astype(np.int64))
        return self._stack_rows, self.weights.stack_table

    def _gather(self, slots: tuple[int, ...]) -> paddle.Tensor:
        if slots not in self._gathers:
            total = sum(len(self.rows[s]) for s in slots)
            g = np.full(self.num_rows, total, np.int64)  # the zero row
            off = 0
            for s in slots:
                g[self.rows[s]] = np.arange(off, off + len(self.rows[s]))
                off += len(self.rows[s])
            self._gathers[slots] = from_numpy(g)
        return self._gathers[slots]

    def apply(self, ops, layer: int, linear: str, x: paddle.Tensor, y: paddle.Tensor) -> paddle.Tensor:
        """y [T, out] plus the LoRA deltas of (layer, linear) for the rows of each adapter that has
        one (x [T, in]: the linear's input)."""
        slots = self.weights.slots
        if len(self.rows) == 1 and len(next(iter(self.rows.values()))) == self.num_rows:  # one adapter, every row
            w = slots[next(iter(self.rows))].get((layer, linear))
            return y if w is None else ops.lora_apply(y, x, [(None, *w)], None)
        if self.sliced:
            groups = [((a, b), *slots[s][(layer, linear)]) for a, b, s in self.runs if (layer, linear) in slots[s]]
            return ops.lora_apply(y, x, groups, None) if groups else y
        groups, used = [], []
        for s in self.rows:
            w = slots[s].get((layer, linear))
            if w is not None:
                used.append(s)
                if s not in self._rows_t:
                    self._rows_t[s] = from_numpy(self.rows[s])
                groups.append((self._rows_t[s], *w))
        return ops.lora_apply(y, x, groups, self._gather(tuple(used))) if groups else y
