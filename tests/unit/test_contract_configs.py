"""The model configs declare what the clients of the two contracts send and ask for: Triton rejects
an input or a requested output a config does not declare ("unexpected inference input / output").

- Triton's OpenAI-compatible frontend (server repo python/openai, engine/utils/triton.py): its vLLM
  format (`--backend vllm`, against `llm`) and its TensorRT-LLM format (against `ensemble`);
- TensorRT-LLM's inflight_batcher_llm ensemble (its config.pbtxt, and what
  tools/inflight_batcher_llm/end_to_end_grpc_client.py requests with --batch-inputs, -n,
  --return-perf-metrics, --guided-decoding-guide-type)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_ENTRY = re.compile(r'\{\s*name:\s*"([^"]+)"\s*data_type:\s*(TYPE_\w+)\s*dims:\s*\[([^\]]*)\]([^}]*)\}')


def declared(model: str) -> tuple[dict, dict, int]:
    """(inputs, outputs, max_batch_size) of model_repository/<model>/config.pbtxt; inputs / outputs:
    name -> (data_type, dims, optional)."""
    text = (REPO / "model_repository" / model / "config.pbtxt").read_text()
    text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    sections = {}
    for kind in ("input", "output"):
        m = re.search(kind + r"\s*\[(.*?)\n\]", text, re.S)
        sections[kind] = {n: (t, [d.strip() for d in dims.split(",")], "optional: true" in rest)
                          for n, t, dims, rest in _ENTRY.findall(m.group(1))}
    mbs = int(re.search(r"max_batch_size:\s*(\d+)", text).group(1))
    return sections["input"], sections["output"], mbs


# what the OpenAI frontend sends
OPENAI_VLLM = {"text_input": "TYPE_STRING", "stream": "TYPE_BOOL", "exclude_input_in_output": "TYPE_BOOL",
               "sampling_parameters": "TYPE_STRING", "return_num_input_tokens": "TYPE_BOOL",
               "return_num_output_tokens": "TYPE_BOOL", "return_logprobs": "TYPE_BOOL"}
OPENAI_TRTLLM = {"text_input": "TYPE_STRING", "stream": "TYPE_BOOL", "max_tokens": "TYPE_INT32",
                 "stop_words": "TYPE_STRING", "top_p": "TYPE_FP32", "frequency_penalty": "TYPE_FP32",
                 "presence_penalty": "TYPE_FP32", "seed": "TYPE_UINT64", "temperature": "TYPE_FP32",
                 "exclude_input_in_output": "TYPE_BOOL", "guided_decoding_guide_type": "TYPE_STRING",
                 "guided_decoding_guide": "TYPE_STRING", "lora_task_id": "TYPE_UINT64",
                 "lora_weights": "TYPE_FP16", "lora_config": "TYPE_INT32",
                 "return_num_input_tokens": "TYPE_BOOL", "return_num_output_tokens": "TYPE_BOOL"}
# TensorRT-LLM's ensemble inputs (beyond the frontend's) and outputs
TRTLLM_INPUTS = {"num_return_sequences": "TYPE_INT32", "bad_words": "TYPE_STRING", "end_id": "TYPE_INT32",
                 "pad_id": "TYPE_INT32", "top_k": "TYPE_INT32", "length_penalty": "TYPE_FP32",
                 "repetition_penalty": "TYPE_FP32", "min_tokens": "TYPE_INT32", "return_log_probs": "TYPE_BOOL",
                 "return_context_logits": "TYPE_BOOL", "return_generation_logits": "TYPE_BOOL",
                 "return_perf_metrics": "TYPE_BOOL", "beam_width": "TYPE_INT32", "decoder_text_input": "TYPE_STRING",
                 "prompt_embedding_table": "TYPE_FP16", "prompt_table_extra_id": "TYPE_UINT64",
                 "prompt_vocab_size": "TYPE_INT32", "embedding_bias_words": "TYPE_STRING",
                 "embedding_bias_weights": "TYPE_FP32"}
TRTLLM_OUTPUTS = {"text_output": "TYPE_STRING", "cum_log_probs": "TYPE_FP32", "output_log_probs": "TYPE_FP32",
                  "context_logits": "TYPE_FP32", "generation_logits": "TYPE_FP32",
                  "batch_index": "TYPE_INT32", "sequence_index": "TYPE_INT32",
                  "kv_cache_alloc_new_blocks": "TYPE_INT32", "kv_cache_reused_blocks": "TYPE_INT32",
                  "kv_cache_alloc_total_blocks": "TYPE_INT32", "arrival_time_ns": "TYPE_INT64",
                  "first_scheduled_time_ns": "TYPE_INT64", "first_token_time_ns": "TYPE_INT64",
                  "last_token_time_ns": "TYPE_INT64", "acceptance_rate": "TYPE_FP32",
                  "total_accepted_draft_tokens": "TYPE_INT32", "total_draft_tokens": "TYPE_INT32",
                  "num_input_tokens": "TYPE_INT32", "num_output_tokens": "TYPE_INT32"}


@pytest.mark.parametrize("model, wanted", [("llm", OPENAI_VLLM), ("ensemble", OPENAI_TRTLLM),
                                           ("ensemble", TRTLLM_INPUTS)])
def test_inputs_declared_with_their_types_and_optional(model, wanted):
    inputs, _, _ = declared(model)
    for name, dtype in wanted.items():
        assert name in inputs, f"{model} does not declare input {name}"
        assert inputs[name][0] == dtype, f"{model}.{name}: {inputs[name][0]} != {dtype}"
        assert inputs[name][2] or name == "text_input", f"{model}.{name} must be optional"


def test_ensemble_outputs_are_tensorrt_llm_s():
    _, outputs, mbs = declared("ensemble")
    assert mbs > 1, "batched [B, 1] requests need max_batch_size > 1"
    for name, dtype in TRTLLM_OUTPUTS.items():
        assert name in outputs, f"ensemble does not declare output {name}"
        assert outputs[name][0] == dtype, f"ensemble.{name}: {outputs[name][0]} != {dtype}"


def test_llm_outputs_the_openai_frontend_reads():
    _, outputs, mbs = declared("llm")
    assert mbs == 0
    assert outputs["num_input_tokens"][0] == outputs["num_output_tokens"][0] == "TYPE_UINT32"
    assert {"text_output", "logprobs"} <= set(outputs)


def test_pipeline_sends_preprocessing_only_what_it_declares():
    from paddle_llm_triton.ensemble.steps import PRE_INPUTS, UNSUPPORTED_INPUTS

    pre, _, _ = declared("preprocessing")
    ens, _, _ = declared("ensemble")
    assert set(PRE_INPUTS) <= set(pre)
    assert set(PRE_INPUTS) <= set(ens) and set(UNSUPPORTED_INPUTS) <= set(ens)
