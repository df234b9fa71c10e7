"""Malformed requests: each must be refused as INVALID_ARG with a message naming the field, with no
output, while every other request keeps running. gRPC streams carry only the message (the code is
not sent on a stream), so there the field name is what is checked; HTTP must answer 400."""

from __future__ import annotations

import json
import time

import numpy as np
import requests
import tritonclient.grpc as grpcclient

from clients import ensemble_inputs, llm_inputs  # tests/support
from records import Outcome
from streams import Stream, StreamTimeout, final

_OK_SP = {"max_tokens": 4}


def _llm(text="Hello", sp=None, raw=None):
    return llm_inputs(text, True, raw if raw is not None else json.dumps({**_OK_SP, **(sp or {})}))


def _replace(inputs, name, dtype, value, shape):
    t = grpcclient.InferInput(name, shape, dtype)
    t.set_data_from_numpy(np.array(value).reshape(shape))
    return [i for i in inputs if i.name() != name] + [t]


# (model, field the error must name, gRPC inputs builder)
GRPC_CASES = [
    ("llm", "text_input", lambda: _llm(text="")),
    ("llm", "max_tokens", lambda: _llm(sp={"max_tokens": 0})),
    ("llm", "top_p", lambda: _llm(sp={"top_p": 2})),
    ("llm", "temperature", lambda: _llm(sp={"temperature": -1})),
    ("llm", "bogus_knob", lambda: _llm(sp={"bogus_knob": 1})),
    ("llm", "sampling_parameters.n", lambda: _llm(sp={"n": 65})),  # 1..64 are served
    ("llm", "sampling_parameters", lambda: _llm(raw="{not json")),
    ("llm", "lora_name", lambda: _llm(sp={"lora_name": "no_such_adapter"})),  # unknown (or LoRA off): named
    ("llm", "stream", lambda: _replace(_llm(), "stream", "INT32", np.array([1], dtype=np.int32), [1])),
    ("ensemble", "text_input", lambda: ensemble_inputs("", max_tokens=4, stream=True)),
    ("ensemble", "max_tokens", lambda: ensemble_inputs("Hello", max_tokens=0, stream=True)),
    ("ensemble", "top_p", lambda: ensemble_inputs("Hello", max_tokens=4, top_p=2.0, stream=True)),
    ("ensemble", "temperature", lambda: ensemble_inputs("Hello", max_tokens=4, temperature=-1.0, stream=True)),
    ("ensemble", "beam_width", lambda: ensemble_inputs("Hello", max_tokens=4, beam_width=2, stream=True)),
    ("ensemble", "guided_decoding_guide_type",
     lambda: ensemble_inputs("Hello", max_tokens=4, guided_decoding_guide_type="xml", stream=True)),
    ("ensemble", "max_tokens", lambda: _replace(ensemble_inputs("Hello", stream=True), "max_tokens", "FP32",
                                                np.array([[4.0]], dtype=np.float32), [1, 1])),
]

# (model, field, JSON body). Plain JSON scalars of the wrong type are left out: Triton 2.51's HTTP
# front end answers those itself with 500 "Unable to parse 'data'", naming no field.
HTTP_CASES = [
    ("llm", "text_input", {"text_input": "", "sampling_parameters": json.dumps(_OK_SP)}),
    ("llm", "top_p", {"text_input": "Hello", "sampling_parameters": json.dumps({**_OK_SP, "top_p": 2})}),
    ("llm", "bogus_knob", {"text_input": "Hello", "sampling_parameters": json.dumps({**_OK_SP, "bogus_knob": 1})}),
    ("llm", "lora_name", {"text_input": "Hello", "sampling_parameters": json.dumps({**_OK_SP, "lora_name": "nope"})}),
    ("llm", "max_tokens", {"text_input": "Hello", "sampling_parameters": json.dumps({"max_tokens": "x"})}),
    ("ensemble", "max_tokens", {"text_input": "Hello", "max_tokens": 0}),
    ("ensemble", "top_p", {"text_input": "Hello", "max_tokens": 4, "top_p": 2.0}),
    ("ensemble", "temperature", {"text_input": "Hello", "max_tokens": 4, "temperature": -1.0}),
    ("ensemble", "beam_width", {"text_input": "Hello", "max_tokens": 4, "beam_width": 2}),
]


def grpc_bad(ctx, client: str, rng, model: str | None = None) -> Outcome:
    """One malformed gRPC request drawn from GRPC_CASES (model and field from the case); the Outcome
    expects invalid_arg:<field>."""
    model, field, build = rng.choice(GRPC_CASES)
    out = Outcome("grpc_bad_input", model, "grpc", client, ctx.new_id(), expect=f"invalid_arg:{field}")
    try:
        s = Stream(ctx.grpc_url())
    except Exception as e:  # noqa: BLE001
        out.status, out.error, out.t_end = "error", f"connect: {e}", time.monotonic()
        return out
    ok = False
    try:
        out.t_send = s.send(model, build(), out.request_id)
        while True:
            _, result, error = s.next(timeout=ctx.stall_s)
            if error is not None:
                out.status, out.error = "error", str(error)
                break
            if result.get_response().outputs:
                out.problems.append("a malformed request produced output")
            if final(result):
                out.status, ok = "ok", True
                break
    except StreamTimeout as e:
        out.status, out.error = "stall", str(e)
    except Exception as e:  # noqa: BLE001
        out.status, out.error = "error", f"send: {e}"
    finally:
        (s.close if ok else s.cancel)()
    out.t_end = time.monotonic()
    if out.problems:
        out.status = "malformed"
    return out


def http_bad(ctx, client: str, rng, model: str | None = None) -> Outcome:
    """One malformed HTTP generate request drawn from HTTP_CASES; the Outcome expects invalid_arg:<field> (HTTP 400)."""
    model, field, body = rng.choice(HTTP_CASES)
    out = Outcome("http_bad_input", model, "http", client, ctx.new_id(), expect=f"invalid_arg:{field}")
    out.t_send = time.monotonic()
    try:
        r = requests.post(f"{ctx.http_base()}/v2/models/{model}/generate", json=body, timeout=(5, ctx.stall_s))
        out.http_status = r.status_code
        try:
            msg = r.json().get("error", r.text)
        except ValueError:
            msg = r.text
        out.status, out.error = ("ok", None) if r.status_code == 200 and "error" not in r.text else ("error", msg)
    except requests.Timeout as e:
        out.status, out.error = "stall", f"HTTP time-out: {e}"
    except requests.RequestException as e:
        out.status, out.error = "error", f"{type(e).__name__}: {e}"
    out.t_end = time.monotonic()
    return out
