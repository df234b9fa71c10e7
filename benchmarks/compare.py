"""Side-by-side benchmark: our engine (offline, through Triton `llm`, through Triton `ensemble`, through
the OpenAI frontend) and its peers (HF transformers, llama.cpp's server on F32, Q8_0 (and the shipped Q4_1) GGUFs of the
same weights), one command:

    .venv/bin/python benchmarks/compare.py [--quick] [--concurrency 1,8,32] [--max-tokens 128]
        [--requests-per-stream 1] [--threads 2] [--context-tokens 0]
        [--systems offline,llm,ensemble,openai,hf,llamacpp-f32,llamacpp-q8_0]
        [--quantization wint8] [--engine-kwargs '{"kernels": "composed"}'] [--duration 900] [--out-dir build/bench]

--quick: 16 tokens at 1 and 2 streams, 60 s cap per level (a check that every system runs, not a
measurement). Nothing is ever run at the same time: the systems run one after another, each in a
process of its own that is gone before the next starts (our offline engine in a child of .venv, the
tritonserver through paddle_llm_launcher, HF transformers in build/ref-venv, llama.cpp in
build/peer-venv); only the load clients run in this process, against loopback ports.

Workload (the same for every system): the chat-formatted questions of benchmarks/bench_engine.py,
request i asking question i mod 32, greedy, exactly --max-tokens tokens per request with EOS ignored
(ours offline, `llm` and the OpenAI frontend: ignore_eos; `ensemble`: min_tokens = max_tokens, the
TensorRT-LLM names having no ignore_eos; HF: eos_token_id None; llama.cpp: ignore_eos). At each concurrency C, C streams each send
--requests-per-stream requests one after another (offline: C requests in flight in one LLMEngine,
refilled as they finish; HF: static batches of C, run back to back). Before each level C warm-up
requests of 4 tokens run on a question that is not measured. Prompt tokens: the offline engine,
HF and llama.cpp get the same token ids (the tokenizer's chat template); `llm` gets the same text
in ChatML (checked to tokenize to the same ids) and `ensemble` the question with apply_chat_template;
"ours OpenAI" (paddle_llm_openai, started beside the same tritonserver as `make serve` starts it) gets
the same ChatML text as `llm` on POST /v1/completions, streamed (SSE, stream_options.include_usage),
so its engine work is exactly `llm`'s and the ratio OpenAI / llm is the frontend's overhead (issue 18
asks >= 0.95x at 1 / 8 / 32 streams). The Triton systems run on one tritonserver, level by level
(at each concurrency: llm, ensemble, OpenAI), so a drifting machine load hits them alike.
llama.cpp runs with cache_prompt off: our prefix cache reuses only whole 64-token blocks, which these
~40-token prompts never fill, so neither side reuses the shared system prompt.

Threads: --threads (default 2) for every system, set explicitly: EngineConfig.num_threads / the `llm`
config.pbtxt num_threads, torch.set_num_threads, llama.cpp n_threads and n_threads_batch, plus
OMP_NUM_THREADS / MKL_NUM_THREADS in every child's environment. Bounds: each level has a fixed number
of requests and a time cap (--duration; requests still running at the cap are cut and reported);
every child process has a timeout.

Measured, the same way for every system (summarize_records of client_examples/load_stats.py, the
statistics of load_generator.py, fed with per-token arrival times: gRPC responses, llama.cpp and
OpenAI SSE events, our engine's step ends, HF's step clock; an OpenAI chunk counts one token, the
last one whatever remains of the usage's completion_tokens):
- decode tok/s (aggregate): tokens after each request's first / the time during which at least one
  request was between its first and its last token;
- TTFT: send -> first token; ITL: per-token gaps after the first; p50 / p90 / p99 over all requests;
- of limit: decode tok/s / (C * read bandwidth / bytes of weights read per step), the bandwidth
  measured here with numpy (float64 sum over a 1 GiB array split over --threads threads, best of 5),
  the bytes from the safetensors headers (fp32; a tied embedding counts once as the lm head) or the
  Q8_0 GGUF's tensor data;
- ratios: each of ours (offline, llm, ensemble) to each peer, and llm / ensemble to offline.
Output: tables on stdout, <out-dir>/compare.md (Markdown for docs/benchmarks/results.md), compare.png (decode tok/s
against concurrency), compare.json (everything).

Long contexts (--context-tokens N, issue 17): every prompt is a passage of about N tokens of log
records followed by its question, different per question from the first record on (no shared
prefix block); TTFT is then the prefill of N tokens and decode runs over N tokens of KV. E.g.
`--context-tokens 2000 --concurrency 1 --max-tokens 16 --requests-per-stream 3` (TTFT) and
`--context-tokens 4000 --concurrency 1 --max-tokens 128` (decode at 4,000 tokens of context).

Set-up on first use (idempotent, cached): build/peer-venv with the pinned xllamacpp wheel (and
matplotlib if .venv has none), the F32 / Q8_0 GGUFs by benchmarks/gguf_export.py under
<out-dir>/gguf. HF transformers needs build/ref-venv (`bash scripts/setup.sh --reference`); a peer
that is missing or fails is skipped with a note and the rest still runs.

--quantization Q / --engine-kwargs JSON: EngineConfig fields for ours (offline: LLM kwargs; Triton: the
`llm` model's config.pbtxt parameters of the same names). A name EngineConfig does not have is an
error before anything runs (e.g. quantization, until weight-only int8 exists).
--serving-params JSON: `llm` config.pbtxt parameters that are not engine settings (config_params.py
ServingOptions, e.g. '{"stream_interval": 4}'); Triton systems only, an unknown name is an error.

The code is in benchmarks/comparison/ (one module per job; its __init__ lists them); this file is
the command and the entry point of its worker children (`--worker NAME`).
"""

from __future__ import annotations

import sys
from pathlib import Path

# the package beside this file; when run as a script its folder is on the path already, not when loaded by path
BENCH_DIR = str(Path(__file__).resolve().parent)
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from comparison import cli  # noqa: E402


def main(argv=None) -> int:
    return cli.main(argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
