"""The OpenAI API in front of Triton's `llm` model (vLLM-backend contract), as its own process.

Talks to Triton only, over gRPC streaming (`tritonclient.grpc.aio`); imports neither the engine nor
Paddle, so it can run on another machine. FastAPI + uvicorn serve /v1/models, /v1/completions,
/v1/chat/completions (streamed as SSE and not), /health, /health/ready and /metrics.

Modules: cli (command line, uvicorn, drain on SIGTERM), app (routes), protocol (request schema),
params (OpenAI parameters -> `sampling_parameters`), triton_client (one gRPC stream per sequence),
completions / chat (the two endpoints), streaming (SSE), errors (OpenAI error bodies, Triton message
-> status), metrics (the frontend's Prometheus metrics plus Triton's). chat_template, tools and
tool_parsers render chat prompts and parse tool calls.
"""
