"""The decoder stack of a step in one C++ call (csrc/decode_stack.cc): decode-only steps, and steps
whose rows all come with their own block table and context length (short prompt chunks: every row a
query of the paged decode attention, AttentionMetadata.row_block_tables).

At batch 1 a decoder layer is about nine small kernels; calling each from Python through Paddle's
custom-op dispatch costs 10-40 us, ~6 ms per token on a 30-layer model: more than streaming its
int8 weights takes (about 4 ms on these hosts). DecodeStack hands the same kernels a table of
pointers once per step instead, through ctypes (which releases the GIL for the call: the Triton
responder thread runs meanwhile). It runs the same kernel functions in the same order as the
op-by-op path (the OpSet's rms_norm / linears / qkv_rotary_write / attention / swiglu), so hidden
states and KV cache of a decode-only step are bit-identical to it (tests/unit/test_cpu_decode_stack.py).

It covers dense decoders on the C++ CPU kernels in fp32: layers of [add +] RMSNorm, fused qkv
(biases optional), optional per-head q/k norms, rotary + paged KV write, paged decode attention,
o, RMSNorm, fused gate_up, SwiGLU, down; linears all of one declared kind (paddle_llm_ops.linear):
"fp32" (the GEMV up to GEMV_MAX_BATCH rows, on avx512_vnni the fp32 GEMM up to F32_GEMM_MAX_ROWS as
cpu_kernels.linear does, then MKL's cblas_sgemm as paddle.matmul, up to FP32_SGEMM_MAX_BATCH), "int8" or "w8a8" (<= GEMV_INT8_MAX_BATCH) or "int4" / "w4a8" (<= GEMV_INT4_MAX_BATCH). Steps with long
prompt chunks, larger batches, mixture-of-experts or tensor-parallel models keep the op-by-op path
(the model decides; `build` returns None with the reason for linears it cannot take).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path

import paddle

from paddle_llm_ops import cpu_kernels as ck

_ISA_CODE = {"generic": 0, "avx2_fma": 1, "avx512_vnni": 2}
_F32, _INT8, _W8A8, _INT4, _W4A8 = 0, 1, 2, 3, 4
_ERR_LEN = 512


class _Linear(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int64), ("groups", ctypes.c_int64), ("w", ctypes.c_void_p),
                ("scale", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("N", ctypes.c_int64), ("K", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("in_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("q_norm", ctypes.c_void_p),
                ("k_norm", ctypes.c_void_p), ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear),
                ("down", _Linear), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


class _Args(ctypes.Structure):
    _fields_ = [("isa", ctypes.c_int64), ("act_group", ctypes.c_int64)] + \
               [(n, ctypes.c_int64) for n in ("B", "H", "I", "nh", "kvh", "d", "S", "P", "max_blocks", "block_size",
                                             "num_layers")] + \
               [("eps", ctypes.c_double), ("scale", ctypes.c_double)] + \
               [(n, ctypes.c_void_p) for n in ("embeddings", "positions", "cos", "sin", "slots", "block_tables",
                                               "context_lens", "final_norm", "layers", "out")] + \
               [("sgemm", ctypes.c_void_p), ("gemv_max_batch", ctypes.c_int64), ("kv_dtype", ctypes.c_int64),
                ("lora_rows", ctypes.c_void_p), ("lora", ctypes.c_void_p), ("lora_slots", ctypes.c_int64)]


class _Lora(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("r", ctypes.c_int64), ("col", ctypes.c_int64),
                ("n", ctypes.c_int64)]


# The projections of a layer in the LoRA table's order (csrc/kernels.h PlkDecodeStack.lora): q, k, v
# add into qkv's output, o into o's, gate and up into gate_up's, down into down's.
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraTable:
    """LoRA factors the stack adds to its linears: for each layer, projection (LORA_MODULES) and
    adapter slot, a [r, K] and b [r, n] fp32 (the scale folded into b) adding into output columns
    col .. col + n of the projection's fused linear, or nothing.

    set_slot(slot, {(layer, module): (a, b, col)}) replaces a slot's factors (the table keeps the
    tensors alive)."""

    def __init__(self, num_layers: int, num_slots: int):
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.entries = (_Lora * (num_layers * len(LORA_MODULES) * num_slots))()
        self._keep: dict[int, list] = {}

    def set_slot(self, slot: int, factors: dict) -> None:
        """Raises ValueError for a slot, layer or module out of range, or a factor that is not a
        contiguous CPU fp32 tensor of matching rank."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"LoRA slot {slot} outside [0, {self.num_slots})")
        m = len(LORA_MODULES)
        for layer in range(self.num_layers):
            for j in range(m):
                self.entries[(layer * m + j) * self.num_slots + slot] = _Lora(None, None, 0, 0, 0)
        keep = []
        for (layer, module), (a, b, col) in factors.items():
            if not 0 <= layer < self.num_layers or module not in LORA_MODULES:
                raise ValueError(f"LoRA factors for layer {layer} {module!r}: no such projection in the stack")
            r = a.shape[0]
            if len(a.shape) != 2 or len(b.shape) != 2 or b.shape[0] != r or col < 0:
                raise ValueError(f"LoRA factors of layer {layer} {module}: a {list(a.shape)}, b {list(b.shape)}, "
                                 f"column {col} are not [r, K], [r, n], >= 0")
            idx = (layer * m + LORA_MODULES.index(module)) * self.num_slots + slot
            self.entries[idx] = _Lora(_ptr(a, paddle.float32, "LoRA a"), _ptr(b, paddle.float32, "LoRA b"), r, col,
                                      b.shape[1])
            keep += [a, b]
        self._keep[slot] = keep


# The C++ KvDtype codes (csrc/kv_dtype.h) of the cache dtypes the kernels read and write.
_KV_DTYPE_CODE = {paddle.float32: 0, paddle.bfloat16: 1, paddle.float16: 2}


@dataclass(frozen=True)
class StackLayer:
    """One dense decoder layer as the model holds it: in_norm / post_norm [H] fp32, q_norm / k_norm
    [d] fp32 or None, and the OpSet linears qkv [H -> (nh + 2 kvh) d], o [nh d -> H],
    gate_up [H -> 2I] (gate first), down [I -> H]."""

    in_norm: paddle.Tensor
    post_norm: paddle.Tensor
    q_norm: paddle.Tensor | None
    k_norm: paddle.Tensor | None
    qkv: object
    o: object
    gate_up: object
    down: object


# fp32 decode batches above GEMV_MAX_BATCH: MKL's cblas_sgemm, the routine paddle.matmul calls on the
# CPU (its results equal the op-by-op path's bit for bit); a bound on the stack's scratch only.
FP32_SGEMM_MAX_BATCH = 1024


def _mkl_sgemm() -> int | None:
    """Address of cblas_sgemm in the libmklml_intel.so the paddle wheel ships, or None without it."""
    lib = Path(paddle.__file__).resolve().parent / "libs" / "libmklml_intel.so"
    if not lib.is_file():
        return None
    try:
        return ctypes.cast(ctypes.CDLL(str(lib)).cblas_sgemm, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def _ptr(t: paddle.Tensor | None, dtype, what: str) -> int | None:
    if t is None:
        return None
    if t.dtype != dtype or not t.place.is_cpu_place() or not t.is_contiguous():
        raise ValueError(f"decode stack: {what} must be a contiguous CPU {dtype} tensor, got {t.dtype} on {t.place}")
    return t.data_ptr()


@dataclass(frozen=True)
class _KindLayout:
    """How the stack reads a linear of one declared kind (paddle_llm_ops.linear): its code in the C
    table, the weight's attribute and dtype, whether the weight packs two inputs per byte and whether
    it has a scale, and the description of the stack it makes."""

    code: int
    weight: str
    dtype: object
    packed: bool
    scaled: bool
    describe: str


_KINDS = {"fp32": _KindLayout(_F32, "weight", paddle.float32, False, False, "fp32 GEMV"),
          "int8": _KindLayout(_INT8, "qweight", paddle.int8, False, True, "int8 GEMV"),
          "w8a8": _KindLayout(_W8A8, "qweight", paddle.int8, False, True, "int8 x int8 GEMV"),
          "int4": _KindLayout(_INT4, "qweight", paddle.uint8, True, True, "int4 GEMV"),
          "w4a8": _KindLayout(_W4A8, "qweight", paddle.uint8, True, True, "int4 x int8 GEMV")}


def _batch_limit(kind: str, sgemm: int | None) -> int:
    """The largest batch the stack's kernel for linears of `kind` takes."""
    if kind == "fp32":
        return FP32_SGEMM_MAX_BATCH if sgemm else ck.GEMV_MAX_BATCH
    return ck.GEMV_INT4_MAX_BATCH if kind in ("int4", "w4a8") else ck.GEMV_INT8_MAX_BATCH


def _linear(lin, n: int, k: int, what: str, sgemm: int | None) -> tuple[_Linear, int] | str:
    """(_Linear, the batch limit of its kernel), or why this linear cannot join the stack. The
    linear's declared `kind` says how its weights are stored."""
    kind = getattr(lin, "kind", None)
    layout = _KINDS.get(kind)
    if layout is None:
        return (f"{what} is a {type(lin).__name__} of kind {kind!r} (the stack takes kinds "
                f"{', '.join(_KINDS)})")
    bias = _ptr(lin.bias, paddle.float32, f"{what} bias") if getattr(lin, "bias", None) is not None else None
    w = getattr(lin, layout.weight)
    scale = lin.scale if layout.scaled else None
    groups = scale.shape[1] if layout.packed else 1  # int4 / w4a8: one scale per group of inputs
    shape = [n, (k + 1) // 2] if layout.packed else [n, k]
    if list(w.shape) != shape:
        return f"{what} weight is {list(w.shape)}, expected {shape}"
    return _Linear(layout.code, groups, _ptr(w, layout.dtype, f"{what} weight"),
                   _ptr(scale, paddle.float32, f"{what} scale"), bias, n, k), _batch_limit(kind, sgemm)


class DecodeStack:
    """Runs every decoder layer and the final norm of a decode-only step in one C++ call.

    Built by `build` (None where a layer's linears are not all of one supported kind); then
    run(h [B, H] fp32 embeddings, positions [B] int64, cos / sin [P, d] fp32 rotary tables,
    slot_mapping [B] int64, block_tables [B, max_blocks] int32, context_lens [B] int32 (keys per
    sequence, this step's included), kv_caches [(k [kvh, S, d], v) per layer, all float32, bfloat16
    or float16]) -> [B, H] fp32,
    the final RMSNorm's output, with this step's keys and values written into the caches; None
    when B exceeds the kernels' batch limit (`max_batch`: the caller runs the op-by-op path).
    Raises ValueError (nothing written) for out-of-range positions, slots or block ids, or
    tensors of the wrong dtype, place or layout."""

    def __init__(self, isa: str, block_size: int, layers: list[_Layer], keep: list, final_norm: paddle.Tensor,
                 hidden: int, intermediate: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                 scale: float, max_batch: int, kind: str, sgemm: int | None = None):
        self.max_batch = max_batch
        self.kind = kind
        self._keep = keep  # the tensors whose addresses the table holds
        self._layers = (_Layer * len(layers))(*layers)
        self._final_norm = final_norm
        self._caches = None
        self._args = _Args(isa=_ISA_CODE[isa], act_group=ck.W8A8_GROUP, H=hidden, I=intermediate, nh=num_heads,
                           kvh=num_kv_heads, d=head_dim, block_size=block_size, num_layers=len(layers), eps=eps,
                           scale=scale, final_norm=_ptr(final_norm, paddle.float32, "final norm"),
                           layers=ctypes.cast(self._layers, ctypes.c_void_p), sgemm=sgemm,
                           gemv_max_batch=ck.GEMV_MAX_BATCH)
        self._fn = ck.c_library().plk_decode_stack
        self._fn.argtypes = [ctypes.POINTER(_Args), ctypes.c_char_p, ctypes.c_int64]
        self._fn.restype = ctypes.c_int
        self._err = ctypes.create_string_buffer(_ERR_LEN)
        # thread_tuner.KernelThreadTuner choosing each call's kernel threads, or None (the count set
        # with set_num_threads); the engine's worker sets it
        self.tuner = None

    @classmethod
    def build(cls, isa: str, block_size: int, layers: list[StackLayer], final_norm: paddle.Tensor, hidden: int,
              intermediate: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
              scale: float) -> tuple[DecodeStack | None, str]:
        """(the stack, a one-line description) or (None, why not)."""
        if isa not in _ISA_CODE:
            return None, f"unknown isa {isa!r}"
        keep, table, limits, kinds = [], [], [], set()
        sgemm = _mkl_sgemm()
        qkv_n = (num_heads + 2 * num_kv_heads) * head_dim
        for i, lay in enumerate(layers):
            lins = {}
            for name, lin, n, k in (("qkv", lay.qkv, qkv_n, hidden), ("o", lay.o, hidden, num_heads * head_dim),
                                    ("gate_up", lay.gate_up, 2 * intermediate, hidden),
                                    ("down", lay.down, hidden, intermediate)):
                got = _linear(lin, n, k, f"layer {i} {name}", sgemm)
                if isinstance(got, str):
                    return None, got
                lins[name], limit = got
                limits.append(limit)
                kinds.add(lin.kind)
                keep.append(lin)
            if (lay.q_norm is None) != (lay.k_norm is None):
                return None, f"layer {i}: q_norm and k_norm must both be given or neither"
            table.append(_Layer(in_norm=_ptr(lay.in_norm, paddle.float32, f"layer {i} in_norm"),
                                post_norm=_ptr(lay.post_norm, paddle.float32, f"layer {i} post_norm"),
                                q_norm=_ptr(lay.q_norm, paddle.float32, f"layer {i} q_norm"),
                                k_norm=_ptr(lay.k_norm, paddle.float32, f"layer {i} k_norm"), **lins))
            keep.append(lay)
        if len(kinds) != 1:
            return None, f"linears of mixed kinds {sorted(kinds)}"
        kind = _KINDS[kinds.pop()].describe
        stack = cls(isa, block_size, table, keep, final_norm, hidden, intermediate, num_heads, num_kv_heads,
                    head_dim, eps, scale, min(limits), kind, sgemm)
        return stack, f"{len(layers)} layers ({kind}, {isa}) in one call for decode-only steps of up to {min(limits)} sequences"

    def _bind_caches(self, kv_caches) -> None:
        a = self._args
        s = None
        dtype = kv_caches[0][0].dtype if kv_caches else paddle.float32
        if dtype not in _KV_DTYPE_CODE:
            raise ValueError(f"decode stack: KV cache dtype {dtype} is not one of float32, bfloat16, float16")
        for i, (k, v) in enumerate(kv_caches):
            for c, what in ((k, "k"), (v, "v")):
                if list(c.shape[::2]) != [a.kvh, a.d] or (s is not None and c.shape[1] != s):
                    raise ValueError(f"decode stack: layer {i} {what} cache is {list(c.shape)}, expected "
                                     f"[{a.kvh}, slots, {a.d}] with the same slots in every layer")
                s = c.shape[1]
            self._layers[i].k_cache = _ptr(k, dtype, f"layer {i} k cache")
            self._layers[i].v_cache = _ptr(v, dtype, f"layer {i} v cache")
        if len(kv_caches) != a.num_layers:
            raise ValueError(f"decode stack: {len(kv_caches)} caches for {a.num_layers} layers")
        a.S = s
        a.kv_dtype = _KV_DTYPE_CODE[dtype]
        self._caches = kv_caches

    def run(self, h: paddle.Tensor, positions: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor,
            slot_mapping: paddle.Tensor, block_tables: paddle.Tensor, context_lens: paddle.Tensor,
            kv_caches, lora_rows: paddle.Tensor | None = None, lora_table: LoraTable | None = None
            ) -> paddle.Tensor | None:
        """lora_rows [B] int64 (each row's adapter slot, -1 none) with lora_table: the rows' LoRA
        deltas are added after each linear; None: no LoRA."""
        b = h.shape[0]
        if b > self.max_batch:
            return None
        if kv_caches is not self._caches:
            self._bind_caches(kv_caches)
        a = self._args
        if list(h.shape) != [b, a.H] or list(positions.shape) != [b] or list(slot_mapping.shape) != [b] \
                or list(context_lens.shape) != [b] or block_tables.shape[0] != b or list(cos.shape) != list(sin.shape) \
                or cos.shape[1] != a.d:
            raise ValueError(f"decode stack: inconsistent shapes h {list(h.shape)}, positions {list(positions.shape)}, "
                             f"slot_mapping {list(slot_mapping.shape)}, block_tables {list(block_tables.shape)}, "
                             f"context_lens {list(context_lens.shape)}, cos {list(cos.shape)}, sin {list(sin.shape)}")
        out = paddle.empty([b, a.H], dtype="float32")
        a.B, a.P, a.max_blocks = b, cos.shape[0], block_tables.shape[1]
        a.embeddings = _ptr(h, paddle.float32, "h")
        a.positions = _ptr(positions, paddle.int64, "positions")
        a.cos = _ptr(cos, paddle.float32, "cos")
        a.sin = _ptr(sin, paddle.float32, "sin")
        a.slots = _ptr(slot_mapping, paddle.int64, "slot_mapping")
        a.block_tables = _ptr(block_tables, paddle.int32, "block_tables")
        a.context_lens = _ptr(context_lens, paddle.int32, "context_lens")
        a.out = out.data_ptr()
        if lora_rows is None:
            a.lora_rows, a.lora, a.lora_slots = None, None, 0
        else:
            if list(lora_rows.shape) != [b] or lora_table is None:
                raise ValueError(f"decode stack: lora_rows {list(lora_rows.shape)} for {b} rows, table {lora_table}")
            a.lora_rows = _ptr(lora_rows, paddle.int64, "lora_rows")
            a.lora = ctypes.addressof(lora_table.entries)
            a.lora_slots = lora_table.num_slots
        tuner = self.tuner
        if tuner is None:
            rc = self._fn(ctypes.byref(a), self._err, _ERR_LEN)
        else:
            threads = tuner.pick(b)
            switch = threads != tuner.threads  # most calls run on the configured count: no ctypes calls
            if switch:
                ck.set_num_threads(threads)
            t0 = time.perf_counter()
            try:
                rc = self._fn(ctypes.byref(a), self._err, _ERR_LEN)
            finally:
                elapsed = time.perf_counter() - t0
                if switch:
                    ck.set_num_threads(tuner.threads)  # the other kernels keep the configured count
            if rc == 0:
                tuner.record(b, threads, elapsed)
        if rc != 0:
            raise ValueError(f"decode stack: {self._err.value.decode(errors='replace')}")
        return out
