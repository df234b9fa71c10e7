"""LLM metrics on Triton's metrics endpoint (pb_utils.MetricFamily), with the names and labels that
docs/operations/metrics.md documents.

Every MetricFamily call happens on one thread ("llm-metrics"), fed by a queue: tritonserver 2.51
crashed when metrics were updated from several threads at once, and the engine thread must not
wait on metric IPC. Producers (engine thread, responder thread, execute()) only enqueue.

Labels on every metric: model, version, instance (plus finish_reason on llm_requests_total, reason
on llm_requests_rejected_total, and device / dtype / kv_cache_dtype / kernels / quantization /
tensor_parallel_size / max_num_seqs / max_num_waiting on llm_engine_info).
Every request `llm` refuses (before or when the engine would queue it) counts once in
llm_requests_total{finish_reason="error"} and once in llm_requests_rejected_total{reason}; a request
aborted at its deadline counts in llm_requests_total{finish_reason="abort"} and in
llm_requests_timed_out_total.

Two name sets (config.pbtxt parameter metrics_names, config_params.py; default both):
- "llm": the llm_* families above;
- "vllm": the same engine values under vLLM's names, types and histogram buckets (vLLM v1's
  Prometheus logger, and Triton's vLLM backend), labelled model_name (the Triton model) and engine
  (the Triton instance, so that instances in separate stub processes keep separate series):
  VLLM_NAMES. They are created when the engine's configuration arrives (on_engine_config: the token
  histograms' 1-2-5 buckets run up to max_model_len). With LoRA on (EngineStats.max_loras > 0) also
  vLLM's vllm:lora_requests_info (LORA_INFO_NAME; MetricSet.set_lora_info).
Every value is computed once, on the metrics thread, and written to every enabled set through a
Fan: one source of truth, no second bookkeeping.

- names.py: the names, reasons and buckets of both sets, and metrics_names parsing (config_params);
- families.py: `MetricSet`, the families and the fans that write to them (created, released);
- recorder.py: `LLMMetrics`, the thread and the values it computes from engine outputs and states.
"""

from paddle_llm_triton.metrics.names import (FINISH_REASONS, NAME_SETS, REJECT_REASONS, VLLM_ITL_BUCKETS, VLLM_NAMES,
                                             VLLM_REQUEST_LATENCY_BUCKETS, VLLM_TTFT_BUCKETS, build_1_2_5_buckets,
                                             parse_name_sets)
from paddle_llm_triton.metrics.recorder import LLMMetrics

__all__ = ["FINISH_REASONS", "LLMMetrics", "NAME_SETS", "REJECT_REASONS", "VLLM_ITL_BUCKETS", "VLLM_NAMES",
           "VLLM_REQUEST_LATENCY_BUCKETS", "VLLM_TTFT_BUCKETS", "build_1_2_5_buckets", "parse_name_sets"]
