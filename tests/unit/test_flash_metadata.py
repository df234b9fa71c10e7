"""The "flash" attention metadata of a mixed step (worker/inputs.py, for the gcu OpSet's one
flash_attn_var_len_gcu call per layer) and the paged "blocks" KV layout's copy on write
(kv_cache.copy_blocks), checked against values worked out by hand from the step."""

from __future__ import annotations

import numpy as np
import paddle

from paddle_llm_engine.models.attention_metadata import FlashMetadata
from paddle_llm_engine.step import SeqStep, Step
from paddle_llm_engine.worker.inputs import pack_step
from paddle_llm_ops.kv_cache import copy_blocks

BS = 4


def test_flash_metadata_of_a_mixed_step():
    step = Step((
        SeqStep("a", 0, (11,), 5, (7, 2), True),                  # decode: 6th token, block 2 offset 1
        SeqStep("b", 0, (12,), 3, (4,), True),                    # decode at a block's last slot
        SeqStep("c", 0, (1, 2, 3, 4, 5), 0, (9, 1), True),        # fresh prompt over two blocks
        SeqStep("d", 0, (6, 7, 8), 4, (3, 5), False),             # chunk after a 4-token prefix-cache hit
    ))
    inp = pack_step(step, BS, "flash")
    m = inp.meta
    assert inp.input_ids.numpy().tolist() == [11, 12, 1, 2, 3, 4, 5, 6, 7, 8]
    assert inp.positions.numpy().tolist() == [5, 3, 0, 1, 2, 3, 4, 4, 5, 6]
    assert m.slot_mapping.dtype == paddle.int32
    assert m.slot_mapping.numpy().tolist() == [2 * BS + 1, 4 * BS + 3, 36, 37, 38, 39, 4, 20, 21, 22]
    assert m.cu_seqlens_q.numpy().tolist() == [0, 1, 2, 7, 10]
    assert m.seqused_k.numpy().tolist() == [6, 4, 5, 7]
    assert m.block_table.dtype == paddle.int32
    assert m.block_table.numpy().tolist() == [[7, 2], [4, 0], [9, 1], [3, 5]]
    assert (m.max_seqlen_q, m.max_seqlen_k, m.num_decodes) == (5, 7, 2)
    # one form for the whole step: no prompt chunks or decode slots of the other forms
    assert isinstance(m, FlashMetadata) and not hasattr(m, "prefills") and not hasattr(m, "decode_slots")
    assert inp.last_rows.tolist() == [0, 1, 6]  # "d" does not sample this step


def test_copy_blocks_in_the_blocks_layout_copies_whole_blocks():
    rng = np.random.default_rng(0)
    k = rng.standard_normal((6, BS, 2, 3)).astype(np.float32)
    v = rng.standard_normal((6, BS, 2, 3)).astype(np.float32)
    caches = [(paddle.to_tensor(k), paddle.to_tensor(v))]
    copy_blocks(caches, [(1, 4), (2, 0)], BS, "float32", layout="blocks")
    want_k, want_v = k.copy(), v.copy()
    want_k[4], want_k[0], want_v[4], want_v[0] = k[1], k[2], v[1], v[2]
    np.testing.assert_array_equal(caches[0][0].numpy(), want_k)
    np.testing.assert_array_equal(caches[0][1].numpy(), want_v)


def test_opset_layout_and_metadata_follow_the_gcu_kernels():
    import pytest

    from paddle_llm_ops.gcu import custom_ops
    from paddle_llm_ops.opset import build_opset

    composed = build_opset()
    assert (composed.kv_layout, composed.attention_metadata, composed.moe_routing) == ("heads_slots", "slots", None)
    cpu = build_opset(cpu_isa="generic", block_size=BS)
    assert (cpu.kv_layout, cpu.attention_metadata) == ("heads_slots", "block_tables")
    flash = build_opset(gcu_attention=True)
    assert (flash.kv_layout, flash.attention_metadata) == ("blocks", "flash")
    assert dict(flash.names)["attention"] == "flash_attn_var_len_gcu" and flash.rms_norm is composed.rms_norm
    # rotary / norms alone keep our cache layout and the composed attention
    rot = build_opset(gcu_rotary=True, gcu_rms_norm=True)
    assert (rot.kv_layout, rot.attention_metadata) == ("heads_slots", "slots")
    assert rot.rms_norm is custom_ops.rms_norm and rot.add_rms_norm is custom_ops.fused_add_rms_norm
    assert build_opset(fused_moe=True).moe_routing is custom_ops.topk_softmax
    with pytest.raises(ValueError, match="different places"):
        build_opset(cpu_isa="generic", block_size=BS, gcu_rotary=True)


def test_the_platform_plan_builds_its_opset():
    from paddle_llm_engine.platforms import PlatformPlan

    off = dict.fromkeys(("cpu_kernels", "fused_rms_norm", "fused_moe", "gcu_attention", "gcu_rotary", "gcu_rms_norm"),
                        False)
    cpu = PlatformPlan("cpu", "float32", "float32", "float32", kernels={**off, "cpu_kernels": True}, cpu_isa="generic",
                       quantization="wint8").opset(BS)
    assert cpu.attention_metadata == "block_tables" and dict(cpu.names)["linear"] == "cpu_int8_generic"
    # a cache gathered through a same-width view, Paddle's fused RMSNorm
    fused = PlatformPlan("gcu:0", "bfloat16", "bfloat16", "float16", kernels={**off, "fused_rms_norm": True}).opset(BS)
    assert dict(fused.names)["kv_gather"] == "float16" and dict(fused.names)["rms_norm"] == "fused"
    flash = PlatformPlan("gcu:0", "bfloat16", "bfloat16", "bfloat16", kernels={**off, "gcu_attention": True}).opset(BS)
    assert (flash.attention_metadata, flash.kv_layout) == ("flash", "blocks")
