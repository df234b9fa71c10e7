"""TensorRT-LLM's LoRA inputs on `ensemble` through the real tritonserver (docs/features/lora.md,
"TensorRT-LLM ensemble: lora_task_id, lora_weights, lora_config"), on a copy of the repository
with enable_lora 1:
- a request with lora_task_id + lora_weights (FP16) + lora_config, the tensors built by hand from
  a random PEFT adapter in TensorRT-LLM's layout (tests/support/trtllm_lora_tensors.py), answers the
  greedy text of the engine run offline on the base checkpoint with that FP16 adapter merged in
  (lora_adapters.merge_adapter: no LoRA code on that side), which differs from the base model's;
- a second request with only the task id answers the same (the instance's task cache);
- an unknown task id without weights is INVALID_ARG with TensorRT-LLM's message, and the server
  keeps serving."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from clients import ensemble_inputs, grpc_stream
from http_clients import http_generate
from lora_adapters import make_adapter, merge_adapter
from repo_edit import set_config_parameter
from trtllm_lora_tensors import fp16_adapter, hand_tensors

pytestmark = pytest.mark.e2e

PROMPT = "My favourite colour is"
N = 8
TASK = 77


@pytest.fixture(scope="module")
def case(tmp_path_factory, smollm2_dir):
    """(hand-built lora_weights, lora_config, the offline reference text)."""
    from paddle_llm_engine.llm import LLM
    from paddle_llm_engine.sampling_params import SamplingParams

    d = tmp_path_factory.mktemp("trtllm_lora")
    ad = make_adapter(smollm2_dir, d / "adapter", seed=7, targets=("q_proj", "v_proj", "o_proj", "down_proj"),
                      r=4, alpha=8.0, magnitude=10.0)
    weights, config = hand_tensors(ad)
    merged = merge_adapter(smollm2_dir, fp16_adapter(ad, d / "adapter16"), d / "merged")
    llm = LLM(str(merged), device="cpu", num_threads=2, max_num_seqs=2, num_kv_blocks=16, max_model_len=256)
    ref = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=N, min_tokens=N))[0].text
    del llm
    shutil.rmtree(merged)
    return weights, config, ref


@pytest.fixture(scope="module")
def lora_server(triton_server_factory):
    return triton_server_factory(lambda repo: set_config_parameter(repo / "llm" / "config.pbtxt", "enable_lora", "1"),
                                 models=["ensemble", "preprocessing", "postprocessing", "llm"])


def _inputs(task_id=None, weights=None, config=None):
    ins = ensemble_inputs(PROMPT, max_tokens=N, min_tokens=N, temperature=0.0, exclude_input_in_output=True)
    for name, arr, dtype in (("lora_task_id", None if task_id is None else np.array([[task_id]], np.uint64), "UINT64"),
                             ("lora_weights", weights, "FP16"), ("lora_config", config, "INT32")):
        if arr is not None:
            t = grpcclient.InferInput(name, list(arr.shape), dtype)
            t.set_data_from_numpy(arr)
            ins.append(t)
    return ins


def test_lora_task_weights_then_id_then_unknown_id(lora_server, case):
    weights, config, ref = case
    url = lora_server.grpc_url
    first = grpc_stream(url, "ensemble", _inputs(TASK, weights, config)).raise_for_error()
    assert first.text == ref
    base = grpc_stream(url, "ensemble", _inputs()).raise_for_error()
    assert base.text and base.text != ref  # the adapter changes the answer
    again = grpc_stream(url, "ensemble", _inputs(TASK)).raise_for_error()
    assert again.text == ref
    # HTTP generate: INVALID_ARG is status 400 there (a gRPC stream's error carries no status code)
    unknown = http_generate(lora_server.http_base, "ensemble", {"text_input": PROMPT, "max_tokens": N,
                                                                 "lora_task_id": TASK + 1})
    assert unknown.status == 400, (unknown.status, unknown.body, unknown.error)
    assert unknown.error == (f"in ensemble 'ensemble', lora_task_id: LoRA task {TASK + 1} not found in cache. "
                             f"Please send LoRA weights with request")
    assert grpc_stream(url, "ensemble", _inputs(TASK)).raise_for_error().text == ref  # still serving
