"""Child-process side of tests/gcu/test_standin_ops.py: `python ops_child.py '<json spec>'`.

Runs custom-op calls on gcu:0 of the stand-in plug-in (CUSTOM_DEVICE_ROOT) in a fresh interpreter:
loaded into the pytest process, the plug-in would make gcu:0 Paddle's default device for every later
test. Prints one line `STANDIN_OPS_RESULT <json>` and leaves with os._exit (no interpreter teardown).

spec:
  "npz_in": arrays named by the calls; "npz_out": where outputs are written (float arrays as float32);
  "calls": [{"op": name, "args": [arg, ...], "save": [name per output or null],
             "save_after": {array name: save-as name}}]   # inputs read back after the call (in place)
     arg: {"t": array name, "dtype": paddle dtype (default: the array's)} | null (absent optional)
          | {"v": python scalar} (attribute)
  "signatures": [op names] -> result["signatures"][op] = {"inputs", "optional", "outputs", "attrs",
             "inplace"} read through OpProtoHolder and core.eager._get_custom_operator_inplace_map.
Result: {"registered": [...], "errors": {call index: message}, "signatures": {...}}.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

MARK = "STANDIN_OPS_RESULT "
DEFAULT_ATTRS = {"op_role", "op_role_var", "op_namescope", "op_callstack", "op_device", "with_quant_attr"}


def signature(name: str) -> dict:
    """The op's registered signature as Paddle reports it (what the engine's signature check reads)."""
    from paddle.base import core
    from paddle.base.framework import OpProtoHolder
    from paddle.base.proto import framework_pb2

    proto = OpProtoHolder.instance().get_op_proto(name)
    attr_type = {v: k for k, v in framework_pb2.AttrType.items()}
    return {
        "inputs": [i.name for i in proto.inputs],
        "optional": [i.name for i in proto.inputs if i.dispensable],
        "outputs": [o.name for o in proto.outputs],
        "attrs": [[a.name, attr_type.get(a.type, str(a.type))] for a in proto.attrs if a.name not in DEFAULT_ATTRS],
        "inplace": {str(k): v for k, v in core.eager._get_custom_operator_inplace_map(name).items()},
    }


def _tensor(arrays, arg, place):
    import paddle

    t = paddle.to_tensor(arrays[arg["t"]], place=place)
    if arg.get("dtype") and arg["dtype"] != str(t.dtype).replace("paddle.", ""):
        t = t.astype(arg["dtype"])
    return t


def _numpy(t):
    import paddle

    if t.dtype in (paddle.bfloat16, paddle.float16):
        t = t.astype("float32")
    return t.cpu().numpy()


def run_calls(spec: dict) -> dict:
    import numpy as np
    import paddle
    from paddle.base import core

    place = paddle.CustomPlace("gcu", 0)
    arrays = dict(np.load(spec["npz_in"])) if spec.get("npz_in") else {}
    out, errors = {}, {}
    for n, call in enumerate(spec.get("calls", [])):
        args, named = [], {}
        for a in call["args"]:
            if a is None:
                args.append(None)
            elif "t" in a:
                named[a["t"]] = _tensor(arrays, a, place)
                args.append(named[a["t"]])
            else:
                args.append(a["v"])
        try:
            res = core.eager._run_custom_op(call["op"], *args)
        except Exception as e:  # the test checks the message
            errors[str(n)] = f"{type(e).__name__}: {e}"
            continue
        res = res if isinstance(res, (list, tuple)) else [res]
        for name, t in zip(call.get("save", []), res):
            if name:
                out[name] = _numpy(t)
                out[name + "__place"] = np.array(str(t.place))
        for src, name in call.get("save_after", {}).items():
            out[name] = _numpy(named[src])
    if spec.get("npz_out"):
        np.savez(spec["npz_out"], **out)
    return {"errors": errors}


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        import paddle_custom_device.gcu.ops as gcu_ops  # registers the plug-in's ops, as the real wheel

        result = {"registered": sorted(gcu_ops.load_lib())}
        result.update(run_calls(spec))
        result["signatures"] = {name: signature(name) for name in spec.get("signatures", [])}
    except BaseException as e:
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
    sys.stderr.flush()
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
