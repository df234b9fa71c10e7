"""The stand-in GCU plug-in's reference custom ops (tests/gcu_standin/standin_ops_*.cc) against numpy
references written here from the ops' published semantics (vLLM / flash-attn / Paddle's weight-only
quantization), their registered signatures against paddle-custom-gcu's PD_BUILD_OP, the call log, and
the "broken" build variant. Not an Enflame GCU: these ops are the oracle of the engine's GCU path.

Every op call runs in a child process (tests/gcu_standin/ops_child.py): loaded into the pytest
process, the plug-in would make gcu:0 Paddle's default device for every later test. Inputs go to the
child and outputs come back through .npz files; the references are computed here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gcu_helpers import child_env, standin_build, tail

CHILD = Path(standin_build.HERE) / "ops_child.py"
MARK = "STANDIN_OPS_RESULT "
TIMEOUT_S = 300.0
FP32_TOL = 2e-5


def run_ops(plugin_dir, package_dir, tmp_path, arrays, calls, signatures=(), env=None) -> tuple[dict, dict]:
    """Run `calls` (ops_child.py spec) on gcu:0 in a child; returns (result json, output arrays)."""
    npz_in, npz_out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(npz_in, **arrays)
    spec = {"npz_in": str(npz_in), "npz_out": str(npz_out), "calls": calls, "signatures": list(signatures)}
    proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)],
                            env=child_env(plugin_dir, package_dir, {"FLAGS_use_stride_kernel": "0", **(env or {})}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"ops child did not finish within {TIMEOUT_S:.0f} s\n{tail(err)}", pytrace=False)
    lines = [line for line in out.splitlines() if line.startswith(MARK)]
    if not lines:
        pytest.fail(f"ops child exited with {proc.returncode} and no result\n{tail(out)}\n{tail(err)}", pytrace=False)
    result = json.loads(lines[-1][len(MARK):])
    if "error" in result:
        pytest.fail(f"ops child raised {result['error']}\n{tail(err)}", pytrace=False)
    outputs = dict(np.load(npz_out)) if npz_out.is_file() else {}
    return result, outputs


def t(name, dtype=None):
    return {"t": name, "dtype": dtype} if dtype else {"t": name}


def v(value):
    return {"v": value}


def close(got, ref, tol=FP32_TOL):
    """max |got - ref| <= tol * max(1, max |ref|)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    assert diff <= tol * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0), f"max diff {diff}"


@pytest.fixture(scope="module")
def broken_plugin_dir() -> Path:
    try:
        return standin_build.build_plugin(variant="broken")
    except standin_build.PluginBuildError as e:
        pytest.fail(str(e), pytrace=False)


# ----------------------------------------------------------------------------- numpy references
def ref_rms_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def ref_rotary(x, table, pos, is_neox):
    """x [T, H, D]; table [max_pos, r] = cos | sin over r/2 frequencies; rotates the first r dims."""
    x = x.astype(np.float64).copy()
    r = table.shape[1]
    cos, sin = table[pos, : r // 2][:, None, :], table[pos, r // 2:][:, None, :]
    if is_neox:
        a, b = x[..., : r // 2].copy(), x[..., r // 2: r].copy()
        x[..., : r // 2], x[..., r // 2: r] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = x[..., 0:r:2].copy(), x[..., 1:r:2].copy()
        x[..., 0:r:2], x[..., 1:r:2] = a * cos - b * sin, b * cos + a * sin
    return x


def ref_attention(q, keys, values, causal=True, scale=None, softcap=0.0, window=(-1, -1), alibi=None):
    """One sequence: q [q_len, H, D], keys/values [k_len, Hk, D] (contiguous) -> [q_len, H, D]."""
    q_len, heads, dim = q.shape
    k_len, kv_heads = keys.shape[0], keys.shape[1]
    scale = dim ** -0.5 if scale is None else scale
    rep = heads // kv_heads
    k = np.repeat(keys.astype(np.float64), rep, axis=1)
    vv = np.repeat(values.astype(np.float64), rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), k) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    i = np.arange(q_len)[:, None] + (k_len - q_len)  # bottom-right aligned query positions
    j = np.arange(k_len)[None, :]
    if alibi is not None:  # flash-attn's ALiBi: - slope * |query position - key position|
        s = s - np.asarray(alibi, np.float64)[:, None, None] * np.abs(i - j)[None]
    allowed = np.ones((q_len, k_len), bool)
    if causal:
        allowed &= j <= i
    if window[0] >= 0:
        allowed &= j >= i - window[0]
    if window[1] >= 0:
        allowed &= j <= i + window[1]
    s = np.where(allowed[None], s, -np.inf)
    out = np.zeros((q_len, heads, dim))
    for r in range(q_len):
        if not allowed[r].any():
            continue
        p = np.exp(s[:, r] - s[:, r].max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out[r] = np.einsum("hk,khd->hd", p, vv)
    return out


# ----------------------------------------------------------------------------- norms
@pytest.mark.parametrize("dtype,tol", [("float32", FP32_TOL), ("bfloat16", 2e-2), ("float16", 5e-3)])
def test_rms_norm_and_fused_add_rms_norm_match_numpy(standin_plugin_dir, standin_package, tmp_path, dtype, tol):
    rng = np.random.default_rng(0)
    x, res = rng.standard_normal((7, 64)).astype(np.float32), rng.standard_normal((7, 64)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    calls = [{"op": "rms_norm_gcu", "args": [t("x", dtype), t("w", dtype), v(1e-6)], "save": ["norm"]},
             {"op": "fused_add_rms_norm_op", "args": [t("x", dtype), t("res", dtype), t("w", dtype), v(1e-5)],
              "save": ["out", "res_out"]}]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path, {"x": x, "res": res, "w": w}, calls)
    assert result["errors"] == {}
    close(out["norm"], ref_rms_norm(x, w, 1e-6), tol)
    close(out["res_out"], x + res, tol)
    close(out["out"], ref_rms_norm(x + res, w, 1e-5), tol)
    assert str(out["norm__place"]) == "Place(gcu:0)"


# ----------------------------------------------------------------------------- rotary
@pytest.mark.parametrize("is_neox,rot", [(True, 16), (False, 16), (True, 8)])
def test_fused_rotary_embedding_rotates_in_place(standin_plugin_dir, standin_package, tmp_path, is_neox, rot):
    rng = np.random.default_rng(1)
    tokens, heads, kv_heads, dim = 5, 4, 2, 16
    q = rng.standard_normal((1, tokens, heads, dim)).astype(np.float32)
    k = rng.standard_normal((1, tokens, kv_heads, dim)).astype(np.float32)
    freqs = np.outer(np.arange(32), 1.0 / 10000 ** (np.arange(rot // 2) * 2 / rot))
    table = np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1).astype(np.float32)
    pos = np.array([[0, 3, 7, 30, 31]], np.int32)
    calls = [{"op": "fused_rotary_embedding_gcu", "args": [t("q"), t("k"), t("table"), t("pos"), v(is_neox)],
              "save": ["q_out", "k_out"], "save_after": {"q": "q_after", "k": "k_after"}}]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path,
                          {"q": q, "k": k, "table": table, "pos": pos}, calls)
    assert result["errors"] == {}
    ref_q, ref_k = ref_rotary(q[0], table, pos[0], is_neox), ref_rotary(k[0], table, pos[0], is_neox)
    for name, ref in (("q_out", ref_q), ("q_after", ref_q), ("k_out", ref_k), ("k_after", ref_k)):
        close(out[name][0], ref)
    assert not np.allclose(ref_q, q[0])  # the rotation did something


def test_fused_rotary_embedding_refuses_what_the_real_op_refuses(standin_plugin_dir, standin_package, tmp_path):
    q = np.zeros((3, 2, 8), np.float32)  # rank 3: the real op enforces rank 4
    table = np.zeros((4, 8), np.float32)
    calls = [{"op": "fused_rotary_embedding_gcu", "args": [t("q"), t("q"), t("table"), t("pos"), v(True)]},
             {"op": "fused_rotary_embedding_gcu", "args": [t("q4"), t("q4"), t("table"), t("far"), v(True)]}]
    result, _ = run_ops(standin_plugin_dir, standin_package, tmp_path,
                        {"q": q, "q4": q[None], "table": table, "pos": np.zeros((1, 3), np.int32),
                         "far": np.array([[0, 1, 4]], np.int32)}, calls)
    assert "must be rank 4" in result["errors"]["0"]
    assert "outside the table" in result["errors"]["1"]


# ----------------------------------------------------------------------------- KV write
def test_reshape_and_cache_flash_writes_slots_in_kernel_order(standin_plugin_dir, standin_package, tmp_path):
    rng = np.random.default_rng(2)
    blocks, bs, kvh, dim = 4, 4, 2, 8
    kc = rng.standard_normal((blocks, bs, kvh, dim)).astype(np.float32)
    vc = rng.standard_normal((blocks, bs, kvh, dim)).astype(np.float32)
    key, val = rng.standard_normal((3, kvh, dim)).astype(np.float32), rng.standard_normal((3, kvh, dim)).astype(np.float32)
    slots = np.array([5, -1, 14], np.int64)
    arrays = {"kc": kc, "vc": vc, "k": key, "v": val, "slots": slots, "slots32": slots.astype(np.int32)}
    calls = [{"op": "reshape_and_cache_flash_gcu", "args": [t("kc"), t("vc"), t("k"), t("v"), t("slots")],
              "save_after": {"kc": "kc_after", "vc": "vc_after"}},
             # the declared-name order (key first) would corrupt a real GCU's data: refused here
             {"op": "reshape_and_cache_flash_gcu", "args": [t("k"), t("v"), t("kc"), t("vc"), t("slots32")]}]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path, arrays, calls)
    ref_k, ref_v = kc.reshape(-1, kvh, dim).copy(), vc.reshape(-1, kvh, dim).copy()
    ref_k[[5, 14]], ref_v[[5, 14]] = key[[0, 2]], val[[0, 2]]
    np.testing.assert_array_equal(out["kc_after"].reshape(-1, kvh, dim), ref_k)
    np.testing.assert_array_equal(out["vc_after"].reshape(-1, kvh, dim), ref_v)
    assert list(result["errors"]) == ["1"] and "key_cache, value_cache, key, value" in result["errors"]["1"]


# ----------------------------------------------------------------------------- attention
def _paged(rng, seqs, blocks, bs, kvh, dim):
    """Paged caches [blocks, bs, kvh, D] and a shuffled block table holding each sequence's keys."""
    kc = rng.standard_normal((blocks, bs, kvh, dim)).astype(np.float32)
    vc = rng.standard_normal((blocks, bs, kvh, dim)).astype(np.float32)
    max_blocks = max(-(-k // bs) for _, k in seqs)
    perm = rng.permutation(blocks)
    table = np.zeros((len(seqs), max_blocks), np.int32)
    used = 0
    for s, (_, k_len) in enumerate(seqs):
        n = -(-k_len // bs)
        table[s, :n] = perm[used:used + n]
        used += n
    return kc, vc, table


def _gather(cache, table_row, k_len, bs):
    return np.concatenate([cache[b] for b in table_row])[:k_len] if k_len else cache[0, :0]


def test_flash_attn_paged_mixed_step_matches_numpy(standin_plugin_dir, standin_package, tmp_path):
    """A mixed step: a prefill chunk continuing a cached prefix (q shorter than k), two decodes, a
    full prefill; GQA 4:2; causal bottom-right; query rows past cu_seqlens_q[-1] are zeros."""
    rng = np.random.default_rng(3)
    heads, kvh, dim, bs = 4, 2, 8, 4
    seqs = [(5, 9), (1, 7), (1, 1), (6, 6)]  # (q_len, k_len)
    kc, vc, table = _paged(rng, seqs, 12, bs, kvh, dim)
    cu_q = np.concatenate([[0], np.cumsum([q for q, _ in seqs])]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1] + 2, heads, dim)).astype(np.float32)
    arrays = {"q": q, "kc": kc, "vc": vc, "cu_q": cu_q, "used": np.array([k for _, k in seqs], np.int32),
              "table": table}
    attrs = [v(6), v(9), v(0.0), v(0.3), v(False), v(True), v(-1), v(-1), v(0.0), v(False)]
    args = [t("q"), t("kc"), t("vc"), t("cu_q"), None, t("used"), None, t("table"), None]
    calls = [{"op": "flash_attn_var_len_gcu", "args": args + attrs, "save": ["out"]},
             {"op": "flash_attn_var_len_gcu", "args": args + [v(6), v(8)] + attrs[2:]}]  # max_seqlen_k too small
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path, arrays, calls)
    for s, (q_len, k_len) in enumerate(seqs):
        ref = ref_attention(q[cu_q[s]:cu_q[s + 1]], _gather(kc, table[s], k_len, bs), _gather(vc, table[s], k_len, bs),
                            scale=0.3)
        close(out["out"][cu_q[s]:cu_q[s + 1]], ref)
    assert np.all(out["out"][cu_q[-1]:] == 0)
    assert "max_seqlen_k 8" in result["errors"]["1"] and "0" not in result["errors"]


@pytest.mark.parametrize("causal,softcap,window,alibi", [(False, 0.0, (-1, -1), None), (True, 5.0, (-1, -1), None),
                                                         (True, 0.0, (2, 0), None), (True, 0.0, (-1, -1), [0.5, 0.25])])
def test_flash_attn_unpaged_variants_match_numpy(standin_plugin_dir, standin_package, tmp_path, causal, softcap,
                                                 window, alibi):
    rng = np.random.default_rng(4)
    heads, kvh, dim = 2, 1, 8
    seqs = [(3, 6), (4, 4)]
    cu_q = np.array([0, 3, 7], np.int32)
    cu_k = np.array([0, 6, 10], np.int32)
    q = rng.standard_normal((7, heads, dim)).astype(np.float32) * 2
    k = rng.standard_normal((10, kvh, dim)).astype(np.float32) * 2
    val = rng.standard_normal((10, kvh, dim)).astype(np.float32)
    attrs = [v(4), v(6), v(0.0), v(dim ** -0.5), v(False), v(causal), v(window[0]), v(window[1]), v(softcap), v(False)]
    calls = [{"op": "flash_attn_var_len_gcu", "args": [t("q"), t("k"), t("v"), t("cu_q"), t("cu_k"), None, None,
                                                        None, t("alibi") if alibi else None] + attrs, "save": ["out"]}]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path,
                          {"q": q, "k": k, "v": val, "cu_q": cu_q, "cu_k": cu_k,
                           "alibi": np.array(alibi or [0.0], np.float32)}, calls)
    assert result["errors"] == {}
    for s in range(2):
        ref = ref_attention(q[cu_q[s]:cu_q[s + 1]], k[cu_k[s]:cu_k[s + 1]], val[cu_k[s]:cu_k[s + 1]], causal=causal,
                            softcap=softcap, window=window, alibi=alibi)
        close(out["out"][cu_q[s]:cu_q[s + 1]], ref)


def test_flash_attn_bfloat16_within_tolerance(standin_plugin_dir, standin_package, tmp_path):
    rng = np.random.default_rng(5)
    seqs = [(3, 5), (1, 8)]
    kc, vc, table = _paged(rng, seqs, 6, 4, 2, 16)
    cu_q = np.array([0, 3, 4], np.int32)
    q = rng.standard_normal((4, 4, 16)).astype(np.float32)
    attrs = [v(3), v(8), v(0.0), v(0.25), v(False), v(True), v(-1), v(-1), v(0.0), v(False)]
    args = [t("q", "bfloat16"), t("kc", "bfloat16"), t("vc", "bfloat16"), t("cu_q"), None, t("used"), None,
            t("table"), None]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path,
                          {"q": q, "kc": kc, "vc": vc, "cu_q": cu_q, "used": np.array([5, 8], np.int32),
                           "table": table}, [{"op": "flash_attn_var_len_gcu", "args": args + attrs, "save": ["out"]}])
    assert result["errors"] == {}
    for s, (_, k_len) in enumerate(seqs):
        ref = ref_attention(q[cu_q[s]:cu_q[s + 1]], _gather(kc, table[s], k_len, 4), _gather(vc, table[s], k_len, 4),
                            scale=0.25)
        close(out["out"][cu_q[s]:cu_q[s + 1]], ref, 2e-2)


# ----------------------------------------------------------------------------- signatures, call log, variants
EXPECTED = {  # paddle-custom-gcu backends/gcu/custom_op, PD_BUILD_OP (optional inputs end in @OPTIONAL)
    "flash_attn_var_len_gcu": {
        "inputs": ["query", "key", "value", "cu_seqlens_q", "cu_seqlens_k@OPTIONAL", "seqused_k@OPTIONAL",
                   "leftpad_k@OPTIONAL", "block_table@OPTIONAL", "alibi_slopes@OPTIONAL"],
        "outputs": ["attention_out"],
        "attrs": [["max_seqlen_q", "INT"], ["max_seqlen_k", "INT"], ["p_dropout", "FLOAT"], ["softmax_scale", "FLOAT"],
                  ["zero_tensors", "BOOLEAN"], ["is_causal", "BOOLEAN"], ["window_size_left", "INT"],
                  ["window_size_right", "INT"], ["softcap", "FLOAT"], ["return_softmax", "BOOLEAN"]],
        "inplace": {}},
    "reshape_and_cache_flash_gcu": {
        "inputs": ["key", "value", "key_cache", "value_cache", "slot_mapping"],
        "outputs": ["key_cache_out", "value_cache_out"], "attrs": [], "inplace": {"0": 2, "1": 3}},
    "fused_rotary_embedding_gcu": {
        "inputs": ["query", "key", "cos_sin_table", "positions"], "outputs": ["query_out", "key_out"],
        "attrs": [["is_neox", "BOOLEAN"]], "inplace": {}},
    "rms_norm_gcu": {"inputs": ["x", "weight"], "outputs": ["out"], "attrs": [["epsilon", "FLOAT"]], "inplace": {}},
    "fused_add_rms_norm_op": {"inputs": ["x", "residual", "weight"], "outputs": ["out", "residual_out"],
                              "attrs": [["epsilon", "FLOAT"]], "inplace": {}},
    "linear_quant_gcu": {"inputs": ["lhs", "rhs", "scale", "bias@OPTIONAL"], "outputs": ["linear_out"],
                         "attrs": [["group_size", "INT"]], "inplace": {}},
    "topk_softmax_gcu": {
        "inputs": ["topk_weights", "topk_indices", "token_expert_indices", "gating_output"],
        "outputs": ["topk_weights_out", "topk_indices_out", "token_expert_indices_out"],
        "attrs": [["norm_topk_prob", "BOOLEAN"]], "inplace": {}},
    "moe_align_block_size_gcu": {
        "inputs": ["sorted_token_ids", "experts_ids", "num_tokens_post_pad", "topk_ids"],
        "outputs": ["sorted_token_ids_out", "experts_ids_out", "num_tokens_post_pad_out"],
        "attrs": [["num_experts", "INT"], ["block_size", "INT"]], "inplace": {}},
    "fused_moe_kernel_gcu": {
        "inputs": ["C", "A", "B", "bias@OPTIONAL", "topk_weights", "topk_ids", "sorted_token_ids", "experts_ids",
                   "num_tokens_post_pad"],
        "outputs": ["C_out"], "attrs": [["mul_routed_weight", "BOOLEAN"], ["topk", "LONG"], ["block_size", "LONG"]],
        "inplace": {}},
}


def test_registered_signatures_are_the_real_ones(standin_plugin_dir, standin_package, tmp_path):
    result, _ = run_ops(standin_plugin_dir, standin_package, tmp_path, {}, [], signatures=list(EXPECTED))
    assert set(EXPECTED) <= set(result["registered"])
    for name, want in EXPECTED.items():
        got = result["signatures"][name]
        assert {k: got[k] for k in want} == want, name
        assert got["optional"] == [i for i in want["inputs"] if i.endswith("@OPTIONAL")]


def test_call_log_has_one_line_per_call(standin_plugin_dir, standin_package, tmp_path):
    log = tmp_path / "calls.txt"
    x, w = np.ones((7, 64), np.float32), np.ones(64, np.float32)
    calls = [{"op": "rms_norm_gcu", "args": [t("x"), t("w"), v(1e-6)]},
             {"op": "fused_add_rms_norm_op", "args": [t("x"), t("x"), t("w"), v(1e-6)]}]
    run_ops(standin_plugin_dir, standin_package, tmp_path, {"x": x, "w": w}, calls,
            env={"STANDIN_GCU_CALL_LOG": str(log)})
    assert log.read_text().splitlines() == ["rms_norm_gcu [7, 64]", "fused_add_rms_norm_op [7, 64]"]


def test_broken_variant_has_a_stub_norm_and_a_wrong_attention_signature(broken_plugin_dir, standin_plugin_dir,
                                                                        standin_package, tmp_path):
    assert broken_plugin_dir != standin_plugin_dir and broken_plugin_dir.parent == standin_plugin_dir.parent
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((3, 16)).astype(np.float32), np.ones(16, np.float32)
    calls = [{"op": "rms_norm_gcu", "args": [t("x"), t("w"), v(1e-6)], "save": ["norm"]}]
    result, out = run_ops(broken_plugin_dir, standin_package, tmp_path, {"x": x, "w": w}, calls,
                          signatures=["flash_attn_var_len_gcu", "rms_norm_gcu"])
    assert np.max(np.abs(out["norm"] - ref_rms_norm(x, w, 1e-6))) > 100  # garbage, not the norm
    attrs = [a for a, _ in result["signatures"]["flash_attn_var_len_gcu"]["attrs"]]
    assert "softcap" not in attrs and attrs[-1] == "head_size"
    assert result["signatures"]["rms_norm_gcu"]["attrs"] == EXPECTED["rms_norm_gcu"]["attrs"]


def test_build_variants_are_cached_apart(standin_plugin_dir, broken_plugin_dir):
    assert standin_build.build_plugin() == standin_plugin_dir  # cached: same folder, no rebuild
    assert standin_plugin_dir.name.startswith("good-") and broken_plugin_dir.name.startswith("broken-")
    assert [p.name for p in standin_plugin_dir.iterdir()] == [standin_build.LIB_NAME]
    with pytest.raises(ValueError, match="unknown stand-in variant"):
        standin_build.build_plugin(variant="nope")


# ----------------------------------------------------------------------------- weight-only linear
def quantize(w, bits, group):
    """w [K, N] -> (q [K, N] ints in [-127, 127] or [-7, 7], scale [N] or [ceil(K/group), N]): round to
    nearest of w / scale, scale = max |w| / 127 (or 7) per column or per group of `group` rows."""
    k_dim, n_dim = w.shape
    g = k_dim if group < 0 else group
    groups = -(-k_dim // g)
    scale = np.stack([np.abs(w[i * g:(i + 1) * g]).max(axis=0) for i in range(groups)]) / (127 if bits == 8 else 7)
    q = np.clip(np.round(w / np.repeat(scale, g, axis=0)[:k_dim]), -(127 if bits == 8 else 7), 127 if bits == 8 else 7)
    return q.astype(np.int8), (scale[0] if group < 0 else scale).astype(np.float32)


def pack_int4(q):
    """q [K, N] in [-7, 7] -> uint8 [N, Kp/2], Kp = K rounded up to 128: u = q + 8, and byte (n, 64c + i)
    holds u[128c + i, n] in its low and u[128c + 64 + i, n] in its high nibble (weight_quantize_rtn's)."""
    k_dim, n_dim = q.shape
    kp = -(-k_dim // 128) * 128
    u = np.zeros((kp, n_dim), np.uint8)
    u[:k_dim] = (q.astype(np.int16) + 8).astype(np.uint8)
    chunks = u.reshape(kp // 128, 2, 64, n_dim)
    packed = chunks[:, 0] | (chunks[:, 1] << 4)  # [Kp/128, 64, N]
    return np.ascontiguousarray(packed.reshape(kp // 2, n_dim).T)


def dequantize(q, scale, group):
    g = q.shape[0] if group < 0 else group
    s = scale[None, :] if group < 0 else np.repeat(scale, g, axis=0)[:q.shape[0]]
    return q.astype(np.float64) * s


@pytest.mark.parametrize("bits,group,k_dim", [(8, -1, 96), (8, 64, 128), (4, -1, 96), (4, 64, 192), (4, 128, 256)])
def test_linear_quant_matches_the_dequantized_weight(standin_plugin_dir, standin_package, tmp_path, bits, group, k_dim):
    rng = np.random.default_rng(7)
    n_dim = 48
    w = rng.standard_normal((k_dim, n_dim)).astype(np.float32)
    q, scale = quantize(w, bits, group)
    rhs = q.T.copy() if bits == 8 else pack_int4(q)
    x = rng.standard_normal((2, 3, k_dim)).astype(np.float32)
    bias = rng.standard_normal(n_dim).astype(np.float32)
    calls = [{"op": "linear_quant_gcu", "args": [t("x"), t("rhs"), t("scale"), None, v(group)], "save": ["out"]},
             {"op": "linear_quant_gcu", "args": [t("x"), t("rhs"), t("scale"), t("bias"), v(group)], "save": ["out_b"]},
             {"op": "linear_quant_gcu", "args": [t("x", "bfloat16"), t("rhs"), t("scale"), None, v(group)],
              "save": ["out_bf16"]}]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path,
                          {"x": x, "rhs": rhs, "scale": scale, "bias": bias}, calls)
    assert result["errors"] == {}
    ref = x.astype(np.float64) @ dequantize(q, scale, group)
    close(out["out"], ref, 1e-5)
    close(out["out_b"], ref + bias, 1e-5)
    close(out["out_bf16"], ref, 3e-2)
    # and the quantization itself is as accurate as its bit width allows
    assert np.max(np.abs(ref - x @ w)) < (0.05 if bits == 8 else 0.8) * np.max(np.abs(x @ w))


def test_linear_quant_refuses_a_square_int4_weight_the_real_op_would_mis_size(standin_plugin_dir, standin_package,
                                                                              tmp_path):
    q, scale = quantize(np.ones((128, 128), np.float32), 4, -1)
    calls = [{"op": "linear_quant_gcu", "args": [t("x"), t("rhs"), t("scale"), None, v(-1)]}]
    result, _ = run_ops(standin_plugin_dir, standin_package, tmp_path,
                        {"x": np.ones((1, 128), np.float32), "rhs": pack_int4(q), "scale": scale}, calls)
    assert "N == K = 128" in result["errors"]["0"]


# ----------------------------------------------------------------------------- MoE
def ref_topk_softmax(gating, k, norm):
    p = np.exp(gating - gating.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, idx, axis=-1)
    if norm:
        w = w / w.sum(axis=-1, keepdims=True)
    return w, idx


@pytest.mark.parametrize("norm", [True, False])
def test_topk_softmax_matches_numpy(standin_plugin_dir, standin_package, tmp_path, norm):
    rng = np.random.default_rng(8)
    gating = rng.standard_normal((5, 8)).astype(np.float32)
    gating[2, [1, 6]] = 3.0  # a tie: the lower expert first
    arrays = {"g": gating, "w": np.zeros((5, 2), np.float32), "i": np.zeros((5, 2), np.int32),
              "s": np.zeros((5, 2), np.int32)}
    calls = [{"op": "topk_softmax_gcu", "args": [t("w"), t("i"), t("s"), t("g"), v(norm)],
              "save": ["w_out", "i_out", "s_out"], "save_after": {"w": "w_after"}}]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path, arrays, calls)
    assert result["errors"] == {}
    ref_w, ref_i = ref_topk_softmax(gating.astype(np.float64), 2, norm)
    close(out["w_out"], ref_w)
    close(out["w_after"], ref_w)  # written into the given tensor, as the real op
    np.testing.assert_array_equal(out["i_out"], ref_i)
    assert list(out["i_out"][2]) == [1, 6]
    np.testing.assert_array_equal(out["s_out"], np.arange(2)[None, :] * 5 + np.arange(5)[:, None])


def ref_moe_align(topk_ids, num_experts, block):
    """vLLM's moe_align_block_size in numpy: (sorted ids with sentinel N, expert of each block, total)."""
    flat = topk_ids.reshape(-1)
    sorted_ids, experts = [], []
    for e in range(num_experts):
        members = list(np.nonzero(flat == e)[0])
        padded = -(-len(members) // block) * block
        sorted_ids += members + [flat.size] * (padded - len(members))
        experts += [e] * (padded // block)
    return np.array(sorted_ids, np.int32), np.array(experts, np.int32), len(sorted_ids)


def test_moe_align_block_size_matches_numpy(standin_plugin_dir, standin_package, tmp_path):
    rng = np.random.default_rng(9)
    tokens, k, experts, block = 6, 2, 4, 4
    ids = np.stack([rng.choice(experts - 1, k, replace=False) for _ in range(tokens)]).astype(np.int32)  # expert 3 unused
    cap = ids.size + experts * (block - 1)
    arrays = {"ids": ids, "sorted": np.full(cap, -7, np.int32), "experts": np.zeros(cap // block, np.int32),
              "n": np.zeros(1, np.int32), "small": np.zeros(2, np.int32)}
    calls = [{"op": "moe_align_block_size_gcu", "args": [t("sorted"), t("experts"), t("n"), t("ids"), v(experts),
                                                          v(block)], "save": ["s_out", "e_out", "n_out"]},
             {"op": "moe_align_block_size_gcu", "args": [t("small"), t("experts"), t("n"), t("ids"), v(experts),
                                                          v(block)]}]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path, arrays, calls)
    ref_sorted, ref_experts, total = ref_moe_align(ids, experts, block)
    assert int(out["n_out"][0]) == total
    np.testing.assert_array_equal(out["s_out"][:total], ref_sorted)
    assert np.all(out["s_out"][total:] == ids.size)  # the sentinel fills the rest of the buffer
    np.testing.assert_array_equal(out["e_out"][:total // block], ref_experts)
    assert np.all(out["e_out"][total // block:] == 0)  # untouched
    assert "buffers too small" in result["errors"]["1"]


def test_fused_moe_kernel_two_gemms_match_numpy(standin_plugin_dir, standin_package, tmp_path):
    """FastDeploy's GCU MoE sequence: gate-up GEMM per (token, slot) into C [T, k, 2I], then the down
    GEMM of the activated rows with topk=1 and the routing weight (and a bias), summed over k."""
    rng = np.random.default_rng(10)
    tokens, k, experts, hidden, inter, block = 5, 2, 4, 16, 8, 4
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    w1 = rng.standard_normal((experts, 2 * inter, hidden)).astype(np.float32)
    w2 = rng.standard_normal((experts, hidden, inter)).astype(np.float32)
    b2 = rng.standard_normal((experts, hidden)).astype(np.float32)
    weights, ids = ref_topk_softmax(rng.standard_normal((tokens, experts)), k, True)
    ids = ids.astype(np.int32)
    sorted_ids, blocks, total = ref_moe_align(ids, experts, block)
    h = rng.standard_normal((tokens * k, inter)).astype(np.float32)  # stands for swiglu(C1), any values do
    arrays = {"x": x, "w1": w1, "w2": w2, "b2": b2, "tw": weights.astype(np.float32), "ids": ids, "h": h,
              "sorted": np.concatenate([sorted_ids, np.full(7, ids.size, np.int32)]),
              "blocks": np.concatenate([blocks, np.zeros(2, np.int32)]), "n": np.array([total], np.int32),
              "c1": np.full((tokens, k, 2 * inter), np.nan, np.float32), "c2": np.zeros((tokens, k, hidden), np.float32)}
    routing = [t("tw"), t("ids"), t("sorted"), t("blocks"), t("n")]
    calls = [{"op": "fused_moe_kernel_gcu", "args": [t("c1"), t("x"), t("w1"), None, *routing, v(False), v(k),
                                                      v(block)], "save": ["c1_out"], "save_after": {"c1": "c1_after"}},
             {"op": "fused_moe_kernel_gcu", "args": [t("c2"), t("h"), t("w2"), t("b2"), *routing, v(True), v(1),
                                                      v(block)], "save": ["c2_out"]}]
    result, out = run_ops(standin_plugin_dir, standin_package, tmp_path, arrays, calls)
    assert result["errors"] == {}
    ref1 = np.einsum("th,tjnh->tjn", x.astype(np.float64), w1[ids].astype(np.float64))
    hh = h.reshape(tokens, k, inter).astype(np.float64)
    ref2 = (np.einsum("tji,tjhi->tjh", hh, w2[ids].astype(np.float64)) + b2[ids]) * weights[..., None]
    close(out["c1_out"], ref1)
    close(out["c1_after"], ref1)  # C written in place: every (token, slot) row was reached
    close(out["c2_out"], ref2)
    close(out["c2_out"].sum(axis=1), ref2.sum(axis=1))


def test_stand_in_package_wrappers_call_the_ops(standin_plugin_dir, standin_package, tmp_path):
    """The stand-in paddle_custom_device.gcu.ops imports (registering the ops) and its wrappers run."""
    code = (
        "import numpy as np, paddle, os\n"
        "import paddle_custom_device.gcu.ops as ops\n"
        "x = paddle.to_tensor(np.ones((2, 8), 'float32')); w = paddle.to_tensor(np.full(8, 2.0, 'float32'))\n"
        "y = ops.rms_norm(x, w, 1e-6); o, r = ops.fused_add_rms_norm(x, x, w, 1e-6)\n"
        "kc = paddle.zeros([2, 4, 1, 8]); vc = paddle.zeros([2, 4, 1, 8])\n"
        "ops.reshape_and_cache_flash(x.reshape([2, 1, 8]), x.reshape([2, 1, 8]), kc, vc,\n"
        "                            paddle.to_tensor(np.array([0, 5], 'int32')))\n"
        "print('RESULT', round(float(y.numpy().max()), 4), float(r.numpy().max()), float(kc.numpy()[1, 1].sum()),\n"
        "      y.place)\n"
        "os._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=child_env(standin_plugin_dir, standin_package, {"FLAGS_use_stride_kernel": "0"}))
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    assert line, tail(proc.stderr)
    assert line[0].split()[1:] == ["2.0", "2.0", "8.0", "Place(gcu:0)"]


def test_weight_quantize_rtn_feeds_linear_quant(standin_plugin_dir, standin_package, tmp_path):
    """The stand-in wheel's weight_quantize_rtn gives the layout packed above, and linear_quant_gcu on
    its output approximates x @ w within the bit width's accuracy."""
    code = (
        "import numpy as np, paddle, os, json\n"
        "import paddle_custom_device.gcu.ops as ops\n"
        "rng = np.random.default_rng(11); w = rng.standard_normal((192, 40)).astype('float32')\n"
        "x = rng.standard_normal((3, 192)).astype('float32'); res = {}\n"
        "for algo, g in (('weight_only_int8', -1), ('weight_only_int4', 64), ('weight_only_int4', -1)):\n"
        "    q, s = ops.weight_quantize_rtn(paddle.to_tensor(w), algo, g)\n"
        "    y = ops.linear_quant(paddle.to_tensor(x), q, s, None, g)\n"
        "    res[f'{algo}{g}'] = [str(q.dtype), list(q.shape), list(s.shape), y.numpy().tolist(),\n"
        "                         q.numpy().astype('int64').tolist()]\n"
        "print('RESULT', json.dumps(res)); os._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=child_env(standin_plugin_dir, standin_package, {"FLAGS_use_stride_kernel": "0"}))
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    assert line, tail(proc.stderr)
    res = json.loads(line[0][len("RESULT "):])
    rng = np.random.default_rng(11)
    w = rng.standard_normal((192, 40)).astype(np.float32)
    x = rng.standard_normal((3, 192)).astype(np.float32)
    assert res["weight_only_int8-1"][:3] == ["paddle.int8", [40, 192], [40]]
    assert res["weight_only_int4-1"][:3] == ["paddle.uint8", [40, 128], [40]]
    assert res["weight_only_int464"][:3] == ["paddle.uint8", [40, 128], [3, 40]]
    q4, _ = quantize(w, 4, 64)
    np.testing.assert_array_equal(np.array(res["weight_only_int464"][4]), pack_int4(q4))
    exact = x.astype(np.float64) @ w
    for key, rel in (("weight_only_int8-1", 0.02), ("weight_only_int464", 0.2), ("weight_only_int4-1", 0.3)):
        assert np.max(np.abs(np.array(res[key][3]) - exact)) < rel * np.max(np.abs(exact)), key
