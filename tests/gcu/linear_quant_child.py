"""Child-process side of tests/gcu/test_gcu_linear_quant.py: `python linear_quant_child.py '<json>'`.

Runs on gcu:0 of the stand-in plug-in (CUSTOM_DEVICE_ROOT; never in the pytest process, see
conftest.py) with the stand-in paddle-custom-gcu package on PYTHONPATH. For each case
{"bits", "group_size", "dtype"} of spec["cases"]:
- "check": the registered kernel check gcu_linear_quant (the one the platform plan runs) as
  (max |kernel - composed|, max |composed|);
- "same_as_wheel": GcuQuantLinear's (rhs, scale) equal, byte for byte, what the stand-in wheel's
  weight_quantize_rtn (modelled on the real one) gives for the same [K, N] weight;
- "err_vs_fp32", "bound": max |linear_quant_gcu(x) - x @ W| over the fp32 weight W (no quantization),
  and the rounding bound sum_k |x_k| * scale(k, n) / 2 at the worst output.
Prints one line `LINEAR_QUANT_RESULT <json>` and leaves with os._exit.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

MARK = "LINEAR_QUANT_RESULT "


def run_case(bits: int, group_size: int, dtype: str) -> dict:
    import numpy as np
    import paddle

    import paddle_custom_device.gcu.ops as wheel
    from paddle_llm_ops.gcu.linear_quant import GcuQuantLinear, dequantize_linear_quant, quantize_for_linear_quant
    from paddle_llm_ops.kernel_checks.gcu import check_gcu_linear_quant

    diff, ref = check_gcu_linear_quant(dtype, bits, group_size)
    rng = np.random.default_rng(bits * 1000 + group_size)
    k, n = 384, 40  # 3 chunks of 128: no padding, whole groups of 64 and 128
    w = (rng.standard_normal((k, n)) * rng.uniform(0.05, 1.0, (1, n))).astype(np.float32)
    rhs, scale = quantize_for_linear_quant(w, bits, group_size, dtype)
    algo = "weight_only_int8" if bits == 8 else "weight_only_int4"
    q_wheel, s_wheel = wheel.weight_quantize_rtn(paddle.to_tensor(w), algo, group_size)
    same = bool(np.array_equal(rhs, q_wheel.numpy()) and np.array_equal(scale, s_wheel.astype("float32").numpy()))
    lin = GcuQuantLinear(w, None, dtype, bits, group_size)
    x = rng.standard_normal((7, k)).astype(np.float32)
    got = lin(paddle.to_tensor(x)).astype("float32").numpy()
    exact = x.astype(np.float64) @ w.astype(np.float64)
    per_k = np.abs(dequantize_linear_quant(rhs, scale, bits, k) - w)  # the realised rounding error
    s_k = np.broadcast_to(scale, (k, n)) if scale.ndim == 1 else np.repeat(scale, k // scale.shape[0], axis=0)
    return {"check": [diff, ref], "same_as_wheel": same, "err_vs_fp32": float(np.abs(got - exact).max()),
            "bound_ok": bool(np.all(np.abs(got - exact) <= np.abs(x) @ (s_k / 2) + 1e-4 * (np.abs(x) @ np.abs(w)))),
            "max_weight_err_over_half_step": float((per_k / (s_k / 2)).max()),
            "ref_max": float(np.abs(exact).max()), "place": str(lin.qweight.place)}


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        import paddle

        paddle.set_device("gcu:0")
        result = {"cases": [run_case(c["bits"], c["group_size"], c["dtype"]) for c in spec["cases"]]}
    except BaseException as e:  # reported to the test
        traceback.print_exc()
        result = {"error": {"type": type(e).__name__, "message": str(e)}}
    sys.stderr.flush()
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
