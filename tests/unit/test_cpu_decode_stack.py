"""The decode stack (paddle_llm_ops.cpu_kernels.decode_stack): the whole decoder of a decode-only
step in one C++ call, and the SwiGLU kernel it shares with the op-by-op path.

The reference for the stack is the op-by-op path of the same model on the same kernels: the stack
calls the same functions in the same order, so its hidden states and the KV it writes must be equal
bit for bit, for every linear kind (fp32 GEMV, wint8 int8 x int8 / weight-only int8, wint4 int4 x int8 /
weight-only int4), with
q/k biases (Qwen2) and per-head q/k norms (Qwen3), on every isa this host runs. The SwiGLU kernel is
checked against float64 numpy. Correctness against HF transformers is checked where the engines run
(tests/model: every family's logits and tokens, with the stack on, as the engine runs it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
import pytest

import paddle_llm_ops.cpu_kernels as ck
from paddle_llm_engine.config import ModelConfig
from paddle_llm_engine.models import build_model
from paddle_llm_engine.models.attention_metadata import BlockTablesMetadata, RowTablesMetadata, SlotsMetadata
from paddle_llm_engine.tp.model import build_tp_model
from paddle_llm_engine.tp.shard import ShardPlan
from paddle_llm_ops import build_opset
from test_cpu_kernels import ISA_PARAMS
import tiny_checkpoints as tc

BLOCK = 16
NUM_BLOCKS = 64


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    paddle.set_device("cpu")
    ck.load()
    yield
    ck.set_num_threads(0)


# --------------------------------------------------------------------------------------- SwiGLU
@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("rows,inter", [(1, 37), (3, 128), (17, 1536)])
def test_swiglu_matches_float64(isa, rows, inter):
    rng = np.random.default_rng(rows * 1000 + inter)
    x = (rng.standard_normal((rows, 2 * inter)) * 6).astype(np.float32)
    x[0, :4] = [-100.0, 100.0, 0.0, -0.0]  # saturated gates and zeros
    g, u = x[:, :inter].astype(np.float64), x[:, inter:].astype(np.float64)
    ref = g / (1.0 + np.exp(-g)) * u
    got = ck.swiglu(paddle.to_tensor(x), isa).numpy()
    assert got.shape == (rows, inter) and got.dtype == np.float32
    # a few fp32 ulp; below 1e-30 (a gate under -70: exp256 clamps its argument at 88.38) any tiny
    # value is right
    bad = np.abs(got - ref) > 5e-7 * np.abs(ref) + 1e-30
    assert not bad.any(), f"{bad.sum()} values off, e.g. got {got[bad][:3]} for {ref[bad][:3]}"


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_swiglu_propagates_nan_and_refuses_an_odd_width(isa):
    x = np.ones((1, 16), np.float32)
    x[0, 3] = np.nan
    got = ck.swiglu(paddle.to_tensor(x), isa).numpy()
    assert np.isnan(got[0, 3]) and np.isfinite(np.delete(got[0], 3)).all()
    with pytest.raises(ValueError, match="2 \\* I"):
        ck.swiglu(paddle.to_tensor(np.ones((2, 15), np.float32)), isa)


# ---------------------------------------------------------------------------------- the stack
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {name: str(tc.make_checkpoint(name, tmp_path_factory.mktemp(f"stack_{name}")))
            for name in ("llama_untied", "qwen2", "qwen3")}


def load(model_dir: str, isa: str, quantization: str = ""):
    ops = build_opset(cpu_isa=isa, quantization=quantization, block_size=BLOCK)
    model = build_model(ModelConfig.from_dir(model_dir), ops)
    model.load_weights(model_dir)
    return model


def caches(model, rng, num_blocks: int = NUM_BLOCKS, kv_dtype: str = "float32") -> list[tuple[paddle.Tensor, paddle.Tensor]]:
    """Per layer (k, v) [kvh, NUM_BLOCKS * BLOCK, d] in kv_dtype, filled with random keys and
    values: the context the step's queries attend to."""
    shape = (model.num_kv_heads, num_blocks * BLOCK, model.head_dim)
    return [(paddle.to_tensor(rng.standard_normal(shape).astype(np.float32)).astype(kv_dtype),
             paddle.to_tensor(rng.standard_normal(shape).astype(np.float32)).astype(kv_dtype)) for _ in model.layers]


def decode_step(context_lens: list[int], rng, num_blocks: int = NUM_BLOCKS):
    """A decode-only step for sequences with these context lengths (this step's token included):
    each sequence's blocks are distinct random blocks; its new token sits at position len - 1."""
    b = len(context_lens)
    max_blocks = max(-(-n // BLOCK) for n in context_lens)
    perm = rng.permutation(num_blocks)
    tables = np.zeros((b, max_blocks), np.int32)
    used = 0
    for i, n in enumerate(context_lens):
        k = -(-n // BLOCK)
        tables[i, :k] = perm[used:used + k]
        used += k
    assert used <= num_blocks
    positions = np.array([n - 1 for n in context_lens], np.int64)
    slots = np.array([tables[i, p // BLOCK] * BLOCK + p % BLOCK for i, p in enumerate(positions)], np.int64)
    meta = BlockTablesMetadata(slot_mapping=paddle.to_tensor(slots), num_decodes=b,
                               decode_block_tables=paddle.to_tensor(tables),
                               decode_context_lens=paddle.to_tensor(np.array(context_lens, np.int32)))
    ids = paddle.to_tensor(rng.integers(3, tc.VOCAB, size=b).astype(np.int64))
    return ids, paddle.to_tensor(positions), meta


def run_both(model, context_lens, seed=0, num_blocks: int = NUM_BLOCKS, kv_dtype: str = "float32"):
    """(stack output, op-by-op output, stack caches, op-by-op caches) for one decode step on equal
    starting caches."""
    rng = np.random.default_rng(seed)
    ids, positions, meta = decode_step(context_lens, rng, num_blocks)
    kv = caches(model, rng, num_blocks, kv_dtype)
    kv_ref = [(k.clone(), v.clone()) for k, v in kv]
    stack = model.decode_stack
    assert stack is not None, model.decode_stack_info
    out = model.forward(ids, positions, meta, kv).numpy()
    model.decode_stack = None
    try:
        ref = model.forward(ids, positions, meta, kv_ref).numpy()
    finally:
        model.decode_stack = stack
    return out, ref, kv, kv_ref


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("family", ["llama_untied", "qwen2", "qwen3"])
@pytest.mark.parametrize("quantization", ["", "wint8", "wint4"])
def test_stack_bit_identical_to_op_by_op(checkpoints, isa, family, quantization):
    model = load(checkpoints[family], isa, quantization)
    if quantization == "wint4":  # int4 x int8 where the isa has it, weight-only int4 elsewhere
        kinds = {lin.kind for layer in model.layers for lin in (layer.qkv, layer.o, layer.mlp.gate_up, layer.mlp.down)}
        assert kinds == ({"w4a8"} if isa in ck.W4A8_ISAS else {"int4"}), kinds
    calls = []
    real_run = model.decode_stack.run
    model.decode_stack.run = lambda *a, **k: calls.append(1) or real_run(*a, **k)
    out, ref, kv, kv_ref = run_both(model, [1, 17, 40, 33, 64])
    assert calls, "the forward did not take the decode stack"
    assert out.shape == ref.shape and np.isfinite(ref).all() and np.abs(ref).max() > 0.1
    np.testing.assert_array_equal(out, ref)
    for (k, v), (k_ref, v_ref) in zip(kv, kv_ref):
        np.testing.assert_array_equal(k.numpy(), k_ref.numpy())
        np.testing.assert_array_equal(v.numpy(), v_ref.numpy())


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("quantization", ["", "wint8"])
def test_stack_bit_identical_to_op_by_op_at_gemm_batches(checkpoints, isa, quantization):
    """24 sequences: past GEMV_MAX_BATCH (fp32: the AVX-512 fp32 GEMM on avx512_vnni, MKL's sgemm
    elsewhere) and past W8A8_GEMM_MIN_ROWS (wint8: the int8 GEMM on avx512_vnni): the stack picks
    the kernel the op-by-op linears pick for the same row count."""
    model = load(checkpoints["llama_untied"], isa, quantization)
    out, ref, kv, kv_ref = run_both(model, [3 + 5 * i for i in range(24)], seed=5, num_blocks=160)
    assert out.shape[0] == 24 and np.isfinite(ref).all() and np.abs(ref).max() > 0.1
    np.testing.assert_array_equal(out, ref)
    for (k, v), (k_ref, v_ref) in zip(kv, kv_ref):
        np.testing.assert_array_equal(k.numpy(), k_ref.numpy())
        np.testing.assert_array_equal(v.numpy(), v_ref.numpy())


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("family,quantization", [("llama_untied", ""), ("qwen3", "wint8")])
def test_stack_bit_identical_to_op_by_op_over_a_16bit_cache(checkpoints, isa, kv_dtype, family, quantization):
    model = load(checkpoints[family], isa, quantization)
    out, ref, kv, kv_ref = run_both(model, [1, 17, 40, 33, 64], seed=3, kv_dtype=kv_dtype)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0.1
    np.testing.assert_array_equal(out, ref)
    for (k, v), (k_ref, v_ref) in zip(kv, kv_ref):
        assert k.dtype == getattr(paddle, kv_dtype)
        np.testing.assert_array_equal(k.astype("float32").numpy(), k_ref.astype("float32").numpy())
        np.testing.assert_array_equal(v.astype("float32").numpy(), v_ref.astype("float32").numpy())


def test_stack_describes_itself_and_is_off_where_it_does_not_apply(checkpoints):
    isa = ck.supported_isas()[0]
    model = load(checkpoints["qwen3"], isa, "wint8")
    assert model.decode_stack is not None
    assert "one call" in model.decode_stack_info and isa in model.decode_stack_info
    composed = load_composed(checkpoints["qwen3"])
    assert composed.decode_stack is None and composed.decode_stack_info.startswith("off (the OpSet has none")
    moe_dir = str(tc.make_checkpoint("qwen3_moe", Path(checkpoints["qwen3"]).parent / "moe"))
    moe = load(moe_dir, isa)
    assert moe.decode_stack is None and moe.decode_stack_info == "off (Qwen3MoeForCausalLM combines its layers its own way)"

    # tensor parallel: its own reduce of row-parallel outputs (a one-rank shard loads like the whole model)
    cfg = ModelConfig.from_dir(checkpoints["qwen3"])
    shard = ShardPlan.make(0, 1, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size)
    tp = build_tp_model(cfg, build_opset(cpu_isa=isa, block_size=BLOCK), "float32", shard)
    tp.load_weights(checkpoints["qwen3"])
    assert tp.decode_stack is None
    assert tp.decode_stack_info == "off (TensorParallelQwen3ForCausalLM combines its layers its own way)"


def load_composed(model_dir: str):
    model = build_model(ModelConfig.from_dir(model_dir))
    model.load_weights(model_dir)
    return model


def test_fp32_batches_above_the_gemv_limit_run_mkl_sgemm_bit_identical(checkpoints):
    # above fp32_gemv_max_batch rows (16; 64 on avx512_vnni, where the fp32 GEMM takes 17-64) the
    # op-by-op path calls paddle.matmul; the stack calls the same MKL cblas_sgemm directly
    isa = ck.supported_isas()[0]
    model = load(checkpoints["qwen2"], isa)  # fp32, with q/k/v biases
    rows = ck.fp32_gemv_max_batch(isa) + 1
    assert model.decode_stack.max_batch >= rows, "cblas_sgemm not found in the paddle wheel"
    out, ref, kv, kv_ref = run_both(model, [5 + 2 * i for i in range(rows)], num_blocks=320)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(kv[-1][0].numpy(), kv_ref[-1][0].numpy())


def test_int8_batch_above_the_kernel_limit_takes_the_op_by_op_path(checkpoints):
    model = load(checkpoints["llama_untied"], ck.supported_isas()[0], "wint8")
    assert model.decode_stack.max_batch == ck.GEMV_INT8_MAX_BATCH
    calls = []
    real_run = model.decode_stack.run
    model.decode_stack.run = lambda *a, **k: calls.append(real_run(*a, **k)) or calls[-1]
    out, ref, _, _ = run_both(model, [5 + i for i in range(ck.GEMV_INT8_MAX_BATCH + 1)], num_blocks=256)
    assert calls == [None], "the stack declines (returns None) above its limit"
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("field,value,message", [
    ("slot", 10_000, "slot_mapping\\[1\\] = 10000 outside the cache"),
    ("block", 99, "block_tables\\[1, 0\\] = 99 outside the cache's blocks"),
    ("len", 1000, "context_lens\\[1\\] = 1000 outside"),
])
def test_stack_refuses_out_of_range_indices_and_writes_nothing(checkpoints, field, value, message):
    model = load(checkpoints["llama_untied"], ck.supported_isas()[0], "wint8")
    rng = np.random.default_rng(5)
    ids, positions, meta = decode_step([3, 20], rng)
    if field == "slot":
        meta.slot_mapping = paddle.to_tensor(np.array([meta.slot_mapping.numpy()[0], value], np.int64))
    elif field == "block":
        t = meta.decode_block_tables.numpy().copy()
        t[1, 0] = value
        meta.decode_block_tables = paddle.to_tensor(t)
    else:
        meta.decode_context_lens = paddle.to_tensor(np.array([3, value], np.int32))
    kv = caches(model, rng)
    before = [k.numpy().copy() for k, _ in kv]
    with pytest.raises(ValueError, match=message):
        model.forward(ids, positions, meta, kv)
    for (k, _), b in zip(kv, before):
        np.testing.assert_array_equal(k.numpy(), b)


@pytest.mark.parametrize("quantization", ["", "wint8"])
def test_a_step_with_a_short_prompt_chunk_runs_on_the_stack(checkpoints, quantization):
    # Per-row block tables (worker/inputs.py gives them to steps with few prompt rows): each prompt row
    # is a query over its own context through the paged decode attention. Against the op-by-op path
    # (the fused prefill attention over the chunk's slots): the same up to fp32 summation order.
    from paddle_llm_engine.models.attention_metadata import PrefillChunk

    model = load(checkpoints["qwen3"], ck.supported_isas()[0], quantization)
    rng = np.random.default_rng(11)
    tables = np.array([[3, 7, 0], [5, 1, 9]], np.int32)  # decode A: 20 keys; chunk B: positions 8 .. 12 after a cached prefix
    pos_a, start_b, n_b = 19, 8, 5

    def slot(t, p):
        return int(tables[t, p // BLOCK]) * BLOCK + p % BLOCK

    positions = np.array([pos_a] + list(range(start_b, start_b + n_b)), np.int64)
    slots = np.array([slot(0, pos_a)] + [slot(1, p) for p in range(start_b, start_b + n_b)], np.int64)
    ctx_b = np.array([slot(1, p) for p in range(start_b + n_b)], np.int64)
    meta = RowTablesMetadata(slot_mapping=paddle.to_tensor(slots), num_decodes=1,
                             decode_block_tables=paddle.to_tensor(tables[:1, :2].copy()),
                             decode_context_lens=paddle.to_tensor(np.array([pos_a + 1], np.int32)),
                             prefills=[PrefillChunk(1, n_b, start_b, paddle.to_tensor(ctx_b))],
                             row_block_tables=paddle.to_tensor(np.repeat(tables, [1, n_b], axis=0)),
                             row_context_lens=paddle.to_tensor(np.array([pos_a + 1] + list(range(start_b + 1, start_b + n_b + 1)), np.int32)))
    ids = paddle.to_tensor(rng.integers(3, tc.VOCAB, size=1 + n_b).astype(np.int64))
    kv = caches(model, rng)
    kv_ref = [(k.clone(), v.clone()) for k, v in kv]
    calls = []
    stack, real_run = model.decode_stack, model.decode_stack.run
    stack.run = lambda *a, **k: calls.append(1) or real_run(*a, **k)
    out = model.forward(ids, paddle.to_tensor(positions), meta, kv).numpy()
    model.decode_stack = None
    try:
        ref = model.forward(ids, paddle.to_tensor(positions), meta, kv_ref).numpy()
    finally:
        model.decode_stack = stack
    assert calls, "the mixed step did not take the stack"
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    for (k, v), (k_ref, v_ref) in zip(kv, kv_ref):
        np.testing.assert_allclose(k.numpy(), k_ref.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(v.numpy(), v_ref.numpy(), rtol=1e-4, atol=1e-4)


def test_row_tables_only_for_steps_with_few_short_prompt_rows():
    from paddle_llm_engine.step import SeqStep, Step
    from paddle_llm_engine.worker import inputs as wi

    def step(n_prompt, start=0):
        seqs = (SeqStep("a", 0, (5,), 20, (3, 7), True),
                SeqStep("b", 0, tuple(range(3, 3 + n_prompt)), start,
                        tuple(range(10, 10 + -(-(start + n_prompt) // BLOCK))), True))
        return Step(seqs)

    small = wi.pack_step(step(5, 8), BLOCK, "block_tables").meta
    assert isinstance(small, RowTablesMetadata)
    assert small.row_context_lens.numpy().tolist() == [21, 9, 10, 11, 12, 13]
    assert small.row_block_tables.numpy()[1:, 0].tolist() == [10] * 5
    for big in (step(wi.ROW_TABLES_MAX_PROMPT_ROWS + 1), step(4, wi.ROW_TABLES_MAX_CONTEXT)):
        meta = wi.pack_step(big, BLOCK, "block_tables").meta
        assert type(meta) is BlockTablesMetadata and not hasattr(meta, "row_block_tables")
    meta = wi.pack_step(step(5, 8), BLOCK, "slots").meta
    assert isinstance(meta, SlotsMetadata) and not hasattr(meta, "row_block_tables")


class _Alternating:
    """A stand-in KernelThreadTuner that alternates 1 and 2 threads and keeps what it was told."""

    threads = 2

    def __init__(self):
        self.i, self.records = 0, []

    def pick(self, batch):
        self.i += 1
        return 1 if self.i % 2 else 2

    def record(self, batch, threads, seconds):
        self.records.append((batch, threads, seconds, ck.get_num_threads()))


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("quantization", ["", "wint8"])
def test_a_tuned_stack_gives_the_same_step_on_any_thread_count(checkpoints, isa, quantization):
    """With a tuner the stack runs each call on the count it picks, reports the call's time, and
    restores the configured count; every call's output and KV are bit-identical to the untuned one."""
    ck.set_num_threads(2)
    model = load(checkpoints["qwen3"], isa, quantization)
    stack = model.decode_stack
    assert stack is not None, model.decode_stack_info
    ref, ref_kv = None, None
    try:
        for tuner in (None, _Alternating()):
            stack.tuner = tuner
            for _ in range(2):
                out, _, kv, _ = run_both(model, [5, 17, 40], seed=3)
                assert ck.get_num_threads() == 2
                if ref is None:
                    ref, ref_kv = out, kv
                    continue
                np.testing.assert_array_equal(out, ref)
                for (k, v), (k_ref, v_ref) in zip(kv, ref_kv):
                    np.testing.assert_array_equal(k.numpy(), k_ref.numpy())
                    np.testing.assert_array_equal(v.numpy(), v_ref.numpy())
        # the tuner's calls ran on 1 then 2 threads (the count set during the call is the one the
        # record sees only after restoring, so it is the configured 2)
        assert [(b, t) for b, t, _, _ in tuner.records] == [(3, 1), (3, 2)]
        assert all(s > 0 and now == 2 for _, _, s, now in tuner.records)
    finally:
        stack.tuner = None
        ck.set_num_threads(0)
