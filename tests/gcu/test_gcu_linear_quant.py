"""quantization wint8 / wint4 on the stand-in GCU through linear_quant_gcu (helper A's reference op,
tests/gcu_standin/standin_ops_quant_moe.cc): the engine's quantizer (paddle_llm_ops.gcu.linear_quant)
writes the layout the real wheel's weight_quantize_rtn writes (byte for byte against the stand-in
wheel's model of it), the registered kernel check passes, the output stays within the rounding bound
of the fp32 weights, and a tiny model's greedy tokens with wint8 / wint4 on gcu:0 equal CPU wint8's / wint4's (the
two places' dequantized weights are checked first: they differ only at exact ties w / scale = m + 0.5,
which the CPU rounds half to even and the wheel's quantizer half away from zero: wint8 3 of 3.2 M
weights of the tiny model, all in its LM head; wint4 1). Not an Enflame GCU: the stand-in's op is a
reference, so this proves layout and call sequence, not TopsATen's numerics or speed.

Bounds: check max |kernel - composed| <= 1e-5 x max(1, max |composed|) in fp32 (the plan's
tolerance is 1e-4), 2e-2 in bf16 (the plan's; measured 0.03 of 11); |y - x @ W| <= sum_k |x_k| *
scale / 2 (+ 1e-4 relative slack) per output.
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

from gcu_helpers import child_env, engine_kwargs, run_child, tail

CHILD = Path(__file__).resolve().parent / "linear_quant_child.py"
MARK = "LINEAR_QUANT_RESULT "
CASES = [{"bits": 8, "group_size": -1, "dtype": "float32"}, {"bits": 8, "group_size": 64, "dtype": "float32"},
         {"bits": 4, "group_size": -1, "dtype": "float32"}, {"bits": 4, "group_size": 64, "dtype": "float32"},
         {"bits": 4, "group_size": 128, "dtype": "float32"}, {"bits": 8, "group_size": -1, "dtype": "bfloat16"},
         {"bits": 4, "group_size": 64, "dtype": "bfloat16"}]
TOL = {"float32": 1e-5, "bfloat16": 2e-2}  # bf16: the plan's tolerance (the kernel's output is rounded to bf16)


def _run_cases(plugin_dir, package_dir, cases) -> list[dict]:
    proc = subprocess.Popen([sys.executable, str(CHILD), json.dumps({"cases": cases})],
                            env=child_env(plugin_dir, package_dir, {"FLAGS_use_stride_kernel": "0"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"linear_quant child timed out\n{tail(err)}", pytrace=False)
    lines = [line for line in out.splitlines() if line.startswith(MARK)]
    assert lines, f"no result (exit {proc.returncode})\n{tail(out)}\n{tail(err)}"
    result = json.loads(lines[-1][len(MARK):])
    assert "error" not in result, f"{result['error']}\n{tail(err)}"
    return result["cases"]


def test_linear_quant_gcu_layout_check_and_bound(standin_plugin_dir, standin_package):
    for case, got in zip(CASES, _run_cases(standin_plugin_dir, standin_package, CASES)):
        diff, ref = got["check"]
        print(f"{case}: check {diff:.2e} of {ref:.2f}; |y - x W| {got['err_vs_fp32']:.3f} of {got['ref_max']:.2f}")
        assert got["place"].startswith("Place(gcu:0)"), got["place"]
        assert diff <= TOL[case["dtype"]] * max(1.0, ref), case
        assert got["same_as_wheel"] or case["dtype"] != "float32", case  # bf16: scale rounded first (docstring)
        assert got["bound_ok"], case
        assert got["max_weight_err_over_half_step"] <= 1.0 + 1e-5, case


def _cpu_dequantized(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(dequantized [N, K], scale per weight [N, K]) of CPU wint8 / wint4 (group 64) of w [N, K]."""
    from cpu_kernels_reference import dequantize_int4_reference

    from paddle_llm_ops.cpu_kernels import quantize_int4_numpy, quantize_int8_numpy

    if bits == 8:
        q, s = quantize_int8_numpy(w)
        return q.astype(np.float32) * s[:, None], np.broadcast_to(s[:, None], w.shape)
    q, s = quantize_int4_numpy(w, 64)
    return dequantize_int4_reference(q, s, w.shape[1]), np.repeat(s, 64, axis=1)


def _dequantized_weight_differences(model_dir: str, bits: int) -> tuple[int, int, bool]:
    """CPU wint8 / wint4 (cpu_kernels' quantizers: round half to even) against GCU's
    (quantize_for_linear_quant: round half away from zero, as the wheel's weight_quantize; wint8 per
    channel, wint4 groups of 64, the defaults) for every matrix: (weights whose dequantized values
    differ, weights, every difference is an exact tie w / scale = m + 0.5, where the two roundings
    part by one step)."""
    from safetensors.numpy import load_file

    from paddle_llm_ops.gcu.linear_quant import dequantize_linear_quant, quantize_for_linear_quant

    differ, total, ties = 0, 0, True
    for name, w in load_file(str(Path(model_dir) / "model.safetensors")).items():
        if w.ndim != 2 or "embed" in name:
            continue
        cpu, s = _cpu_dequantized(w, bits)
        rhs, scale = quantize_for_linear_quant(np.ascontiguousarray(w.T), bits, -1 if bits == 8 else 64)
        bad = cpu != dequantize_linear_quant(rhs, scale, bits, w.shape[1]).T
        ratio = (w / s)[bad]
        differ, total = differ + int(bad.sum()), total + w.size
        ties = ties and bool(np.all(ratio - np.floor(ratio) == 0.5))
    return differ, total, ties


@pytest.mark.parametrize("quantization", ["wint8", "wint4"])
def test_tiny_model_on_gcu_gives_cpu_tokens(quantization, standin_plugin_dir, standin_package, gcu_tiny_model_dir,
                                            tmp_path):
    differ, total, ties = _dequantized_weight_differences(gcu_tiny_model_dir, 8 if quantization == "wint8" else 4)
    print(f"dequantized weights: {differ} of {total} differ between the places, all exact ties: {ties}")
    assert ties and differ <= 1e-5 * total  # else the token comparison below would not be meaningful
    prompts = [[1, 2, 3, 4, 5], [7, 300, 12, 9, 4, 4, 8, 100, 3], [42]]
    spec = {"action": "generate", "prompts": prompts, "max_tokens": 12}
    log = str(tmp_path / "calls.log")
    gcu = run_child({**spec, "engine": engine_kwargs(gcu_tiny_model_dir, quantization=quantization, dtype="float32")},
                    standin_plugin_dir, standin_package, env={"STANDIN_GCU_CALL_LOG": log}).ok()
    cpu = run_child({**spec, "engine": engine_kwargs(gcu_tiny_model_dir, quantization=quantization, device="cpu")}, None).ok()
    calls = Path(log).read_text().splitlines()
    # per step: qkv, o, gate_up, down per layer and the LM head, all through linear_quant_gcu
    assert sum(line.startswith("linear_quant_gcu ") for line in calls) >= gcu["steps"] * 5
    assert gcu["tokens"] == cpu["tokens"]
