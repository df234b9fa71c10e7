"""The engine parts of multi-LoRA below the model: the registry's ids and device slots, the
scheduler's max_loras admission, the prefix cache keyed by adapter, the step's row slots, the
lora_modules setting, and the grouped delta op against numpy."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paddle_llm_engine.block_manager import BlockManager
from paddle_llm_engine.config import EngineConfig, ModelConfig
from paddle_llm_engine.lora import LoraAdapter, LoraError, LoraRegistry
from paddle_llm_engine.sampling_params import SamplingParams
from paddle_llm_engine.scheduler import Scheduler
from paddle_llm_engine.sequence import Sequence
from paddle_llm_engine.step import Step, SeqStep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
import lora_adapters  # noqa: E402
import tiny_checkpoints  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama checkpoint and two adapters for it (folders)."""
    root = tmp_path_factory.mktemp("lora_parts")
    model = tiny_checkpoints.make_checkpoint("llama_untied", root / "model")
    a = lora_adapters.make_adapter(model, root / "a", seed=1, r=4)
    b = lora_adapters.make_adapter(model, root / "b", seed=2, r=4, targets=("q_proj", "v_proj"))
    return model, a, b


def _registry(model_dir, max_loras=2):
    return LoraRegistry(ModelConfig.from_dir(str(model_dir)), max_loras, 16)


# -- registry ----------------------------------------------------------------------------------
def test_registry_ids_are_never_reused_and_names_resolve(tiny):
    model, a, b = tiny
    reg = _registry(model)
    x = reg.add("x", str(a))
    assert reg.add("x", str(a)) is x  # the same folder again: the loaded adapter
    with pytest.raises(LoraError) as e:
        reg.add("x", str(b))
    assert e.value.field == "lora_name" and "'x'" in e.value.message and str(a) in e.value.message
    reg.remove("x")
    x2 = reg.add("x", str(b))  # reloaded from another folder: another adapter
    assert x2.lora_id not in (0, x.lora_id)
    assert [ad.name for ad in reg.adapters()] == ["x"]
    with pytest.raises(LoraError) as e:
        reg.get("nope")
    assert e.value.field == "lora_name" and "loaded: x" in e.value.message
    with pytest.raises(LoraError) as e:
        reg.remove("nope")
    assert e.value.field == "lora_name"


def _adapter(lid: int) -> LoraAdapter:
    return LoraAdapter(f"l{lid}", f"/x/{lid}", 4, (), (), lid)


def test_slots_stay_put_and_the_least_recently_used_is_replaced(tiny):
    reg = _registry(tiny[0], max_loras=2)
    a1, a2, a3 = _adapter(1), _adapter(2), _adapter(3)
    slots, loads = reg.assign_slots([a1, a1, a2])
    assert sorted(slots.values()) == [0, 1] and [ld.adapter.lora_id for ld in loads] == [1, 2]
    again, loads = reg.assign_slots([a2, a1])  # resident: no load, same slots
    assert again == slots and loads == ()
    reg.assign_slots([a2])  # a1 is now the least recently used
    s3, loads = reg.assign_slots([a3, a2])
    assert s3[3] == slots[1] and s3[2] == slots[2] and [ld.slot for ld in loads] == [slots[1]]
    with pytest.raises(RuntimeError, match="max_loras 2"):
        reg.assign_slots([a1, a2, a3])


# -- scheduler: at most max_loras adapters among the running sequences -------------------------
def _seq(i: int, lora: LoraAdapter | None) -> Sequence:
    s = Sequence(f"r{i}", [10 + i] * 5, SamplingParams(temperature=0.0), 4, [2])
    s.lora = lora
    return s


def test_scheduler_passes_over_a_further_adapter_and_keeps_its_place():
    sched = Scheduler(BlockManager(64, 16), 8, 256, max_loras=1)
    a, b = _adapter(1), _adapter(2)
    s_a, s_b, s_base, s_a2 = _seq(0, a), _seq(1, b), _seq(2, None), _seq(3, a)
    for s in (s_a, s_b, s_base, s_a2):
        sched.add(s)
    out = sched.schedule()
    assert [x.seq for x in out.scheduled] == [s_a, s_base, s_a2]  # b waits for a's slot
    assert list(sched.waiting) == [s_b]
    for s in (s_a, s_a2):
        sched.finish(s, "stop")
    out = sched.schedule()
    assert s_b in [x.seq for x in out.scheduled]


def test_scheduler_without_lora_admits_every_adapter():
    sched = Scheduler(BlockManager(64, 16), 8, 256)  # max_loras 0: LoRA off, no limit applied
    seqs = [_seq(i, _adapter(i + 1)) for i in range(3)]
    for s in seqs:
        sched.add(s)
    assert [x.seq for x in sched.schedule().scheduled] == seqs


# -- prefix cache --------------------------------------------------------------------------------
def _run_prompt(bm: BlockManager, seq: Sequence) -> int:
    """Admit seq, pretend its prompt was computed, commit its blocks; returns the cached tokens."""
    bm.allocate_prompt(seq, 1000)
    cached = seq.num_computed_tokens
    seq.num_computed_tokens = seq.num_tokens
    bm.commit_full_blocks(seq)
    return cached


def test_prefix_cache_never_shares_blocks_across_adapters():
    bm = BlockManager(64, 4, enable_prefix_caching=True)
    a, b = _adapter(1), _adapter(2)
    prompt = list(range(10, 27))  # 4 full blocks + 1
    def seq(lora, i):
        s = Sequence(f"p{i}", prompt, SamplingParams(), 4, [2])
        s.lora = lora
        return s
    assert _run_prompt(bm, seq(a, 0)) == 0
    assert _run_prompt(bm, seq(b, 1)) == 0      # other adapter: nothing reused
    assert _run_prompt(bm, seq(None, 2)) == 0   # the base model: nothing reused
    assert _run_prompt(bm, seq(a, 3)) == 16     # the same adapter: its 4 full blocks
    assert _run_prompt(bm, seq(None, 4)) == 16


# -- step rows -------------------------------------------------------------------------------------
def test_row_slots_follow_the_packing_order():
    e = [SeqStep("a", 0, (1,), 3, (0,), True, lora_slot=1), SeqStep("b", 0, (5, 6, 7), 0, (1,), True),
         SeqStep("c", 0, (8, 9), 0, (2,), True, lora_slot=0)]
    assert Step(tuple(e)).row_lora_slots().tolist() == [1, -1, -1, -1, 0, 0]
    assert Step(tuple(replace(s, lora_slot=-1) for s in e)).row_lora_slots() is None


# -- settings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("a=/m/a,b=/m/b", [("a", "/m/a"), ("b", "/m/b")]),
    ("a=/m/a  b=/m/b", [("a", "/m/a"), ("b", "/m/b")]),
    (json.dumps([{"name": "a", "path": "/m/a"}]), [("a", "/m/a")]),
    ("", []),
])
def test_lora_modules_forms(text, want):
    assert EngineConfig(model_dir="x", enable_lora=1, lora_modules=text).lora_module_entries() == want


@pytest.mark.parametrize("text, msg", [("a", "not name=path"), ("a=/x,a=/y", "given twice"), ("=/x", "needs a name"),
                                       ('[{"name": 1}]', "each JSON entry"), ("[oops", "not valid JSON")])
def test_lora_modules_errors_name_the_setting(text, msg):
    with pytest.raises(ValueError, match=msg) as e:
        EngineConfig(model_dir="x", enable_lora=1, lora_modules=text).lora_module_entries()
    assert "lora_modules" in str(e.value)


def test_lora_settings_are_checked(tiny):
    cfg = ModelConfig.from_dir(str(tiny[0]))
    for kw, msg in ((dict(max_loras=0), "max_loras"), (dict(max_lora_rank=0), "max_lora_rank"),
                    (dict(enable_lora=2), "enable_lora"), (dict(enable_lora=0, lora_modules="a=/x"), "needs enable_lora")):
        with pytest.raises(ValueError, match=msg):
            EngineConfig(model_dir=str(tiny[0]), **{"enable_lora": 1, **kw}).validate(cfg)
    c = EngineConfig(model_dir=str(tiny[0]), enable_lora=1, max_loras=3)
    c.validate(cfg)
    assert c.max_cpu_loras == 3


# -- the grouped delta op ------------------------------------------------------------------------
def test_lora_apply_matches_numpy_per_row():
    import paddle

    from paddle_llm_ops.lora import lora_apply

    rng = np.random.default_rng(0)
    T, K, N = 7, 12, 10
    x, y = rng.standard_normal((T, K)).astype(np.float32), rng.standard_normal((T, N)).astype(np.float32)
    f = {s: (rng.standard_normal((K, r)).astype(np.float32), rng.standard_normal((r, N)).astype(np.float32))
         for s, r in ((0, 3), (1, 5))}
    slot_of = np.array([1, -1, 0, 1, 1, -1, 0])
    rows = {s: np.flatnonzero(slot_of == s) for s in f}
    order = [1, 0]
    gather = np.full(T, sum(len(rows[s]) for s in order))
    off = 0
    for s in order:
        gather[rows[s]] = np.arange(off, off + len(rows[s]))
        off += len(rows[s])
    t = paddle.to_tensor
    got = lora_apply(t(y), t(x), [(t(rows[s]), t(f[s][0]), t(f[s][1])) for s in order], t(gather)).numpy()
    want = y.astype(np.float64).copy()
    for i, s in enumerate(slot_of):
        if s >= 0:
            want[i] += x[i].astype(np.float64) @ f[s][0] @ f[s][1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[slot_of < 0], y[slot_of < 0])  # rows without an adapter untouched
    a, b = f[0]
    got_all = lora_apply(t(y), t(x), [(None, t(a), t(b))], None).numpy()
    np.testing.assert_allclose(got_all, y + x.astype(np.float64) @ a @ b, rtol=1e-5, atol=1e-5)


def test_kv_events_carry_the_adapter_and_start_each_chain_without_a_parent():
    from paddle_llm_engine.kv_events import to_events

    bm = BlockManager(64, 4, enable_prefix_caching=True)
    bm.events = []
    for i, lora in enumerate((_adapter(7), None)):
        s = Sequence(f"e{i}", list(range(10, 19)), SamplingParams(), 4, [2])
        s.lora = lora
        _run_prompt(bm, s)
    ev = to_events(bm.events, 4, "cpu")
    assert [(e.parent_block_hash, e.lora_id, len(e.block_hashes)) for e in ev] == [(None, 7, 2), (None, None, 2)]
    assert set(ev[0].block_hashes).isdisjoint(ev[1].block_hashes)


def test_lora_apply_ranges_equal_the_gathered_form():
    import paddle

    from paddle_llm_ops.lora import lora_apply

    rng = np.random.default_rng(1)
    T, K, N = 9, 6, 5
    x, y = rng.standard_normal((T, K)).astype(np.float32), rng.standard_normal((T, N)).astype(np.float32)
    f = [(rng.standard_normal((K, 2)).astype(np.float32), rng.standard_normal((2, N)).astype(np.float32))
         for _ in range(2)]
    t = paddle.to_tensor
    ranges = [(5, 8), (1, 3)]  # out of order, base rows before, between and after
    got = lora_apply(t(y), t(x), [(r, t(a), t(b)) for r, (a, b) in zip(ranges, f)], None).numpy()
    want = y.astype(np.float64).copy()
    for (s, e), (a, b) in zip(ranges, f):
        want[s:e] += x[s:e].astype(np.float64) @ a @ b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == (T, N)


def test_stack_lora_table_refuses_what_the_kernel_cannot_read():
    import paddle

    from paddle_llm_ops.cpu_kernels.decode_stack import LoraTable

    table = LoraTable(num_layers=2, num_slots=2)
    a, b = paddle.zeros([4, 8]), paddle.zeros([4, 6])
    table.set_slot(1, {(0, "q_proj"): (a, b, 0), (1, "down_proj"): (a, b, 0)})
    assert [(e.r, e.col, e.n) for e in table.entries if e.r] == [(4, 0, 6), (4, 0, 6)]
    for factors, msg in (({(2, "q_proj"): (a, b, 0)}, "no such projection"),
                         ({(0, "embed_tokens"): (a, b, 0)}, "no such projection"),
                         ({(0, "q_proj"): (a, paddle.zeros([3, 6]), 0)}, r"\[r, K\]"),
                         ({(0, "q_proj"): (a, b, -1)}, ">= 0")):
        with pytest.raises(ValueError, match=msg):
            table.set_slot(0, factors)
    with pytest.raises(ValueError, match="slot 2"):
        table.set_slot(2, {})
