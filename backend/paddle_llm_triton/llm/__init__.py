"""The `llm` model's room: one engine per instance and the two kinds of request it serves.

- instance.py: `LLMInstance`: builds the engine, engine loop, metrics, responder, engine channel,
  drain, control bus, stop requests and watchdog of one instance, and closes them in order;
- vllm_request.py: a direct request in Triton's vLLM-backend contract (inputs -> prompt ids,
  SamplingParams, ResponseOptions) and its responses;
- ensemble_steps.py: the ensemble's engine requests, arriving on the engine channel (no pb_utils);
- lora_tasks.py: TensorRT-LLM's LoRA task ids of those requests, cached by task id as adapters;
- responder.py: the thread that turns engine outputs into Triton responses and sees cancellation;
- delta_buffer.py: when a sequence's output is worth a response (both request kinds);
- stop_requests.py: TensorRT-LLM `stop` by Triton request id, across instances over the control bus.

Nothing here imports the ensemble room: the ensemble's messages are engine_channel/protocol.py.
"""
