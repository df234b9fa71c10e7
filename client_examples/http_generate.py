"""One answer through Triton's HTTP generate extension (`POST /v2/models/<model>/generate`, one JSON reply).

    .venv/bin/python client_examples/http_generate.py "What is the capital of France?" [--url 127.0.0.1:8000]
    .venv/bin/python client_examples/http_generate.py "What is the capital of France?" --model llm --temperature 0.7 --seed 1

--model ensemble (default): the TensorRT-LLM tensor names as plain JSON scalars
    {"text_input": ..., "max_tokens": 128, "temperature": 0.0, "apply_chat_template": true,
    "exclude_input_in_output": true}; the server
    applies the model's chat template (extension input apply_chat_template) unless --no-chat-template.
--model llm: the Triton vLLM-backend contract, {"text_input": ..., "stream": false,
    "sampling_parameters": "<JSON string>", "exclude_input_in_output": true, "return_*": true}. The vLLM
    contract takes text as is, so this client wraps the question in the SmolLM2 / ChatML chat format
    itself unless --no-chat-template.

Prints the generated text on stdout; finish reason, token counts and time on stderr. The generate
extension answers with exactly one response, so this is for non-streamed requests; for streaming use
http_generate_stream.py (SSE) or grpc_stream.py. Only the standard library is needed for HTTP.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(question: str, system: str = SYSTEM_PROMPT) -> str:
    """The SmolLM2-Instruct chat template (ChatML) for one user turn plus the assistant prompt."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def build_payload(args) -> dict:
    if args.model == "ensemble":
        body = {"text_input": args.prompt, "max_tokens": args.max_tokens, "temperature": args.temperature,
                "apply_chat_template": not args.no_chat_template,
                "exclude_input_in_output": not args.include_input}
        if args.temperature > 0:  # TensorRT-LLM semantics: without top_k / top_p decoding is greedy
            body["top_p"] = args.top_p
        if args.seed is not None:
            body["seed"] = args.seed
        return body
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p}
    if args.seed is not None:
        sampling["seed"] = args.seed
    text = args.prompt if args.no_chat_template else chatml(args.prompt)
    return {"text_input": text, "stream": False, "sampling_parameters": json.dumps(sampling),
            "exclude_input_in_output": not args.include_input, "return_finish_reason": True,
            "return_num_input_tokens": True, "return_num_output_tokens": True}


def post_json(url: str, body: dict, timeout: float) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode("utf-8"))
    except urllib.error.HTTPError as e:  # Triton puts {"error": "..."} in 4xx / 5xx bodies
        raw = e.read().decode("utf-8", errors="replace")
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"error": raw}


def first(value):
    """Generate-extension outputs come back as scalars or as (nested) lists: take the first scalar."""
    while isinstance(value, list):
        if not value:
            return None
        value = value[0]
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("--url", default="127.0.0.1:8000", help="HTTP endpoint, host:port")
    ap.add_argument("--model", choices=("ensemble", "llm"), default="ensemble")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-chat-template", action="store_true", help="send the prompt as raw text")
    ap.add_argument("--include-input", action="store_true",
                    help="exclude_input_in_output false: the reply starts with the prompt text")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--verbose", "-v", action="store_true", help="also print the full JSON reply on stderr")
    args = ap.parse_args()

    url = f"http://{args.url}/v2/models/{args.model}/generate"
    t0 = time.monotonic()
    status, body = post_json(url, build_payload(args), args.timeout)
    elapsed = time.monotonic() - t0
    if args.verbose:
        print(json.dumps(body, indent=2, ensure_ascii=False), file=sys.stderr)
    if status != 200 or "error" in body:
        print(f"error (HTTP {status}): {body.get('error', body)}", file=sys.stderr)
        return 1
    print(first(body.get("text_output")) or "")
    info = [f"{elapsed:.3f} s"]
    for key in ("finish_reason", "num_input_tokens", "num_output_tokens"):
        if key in body:
            info.append(f"{key} {first(body[key])}")
    print(f"[{', '.join(info)}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
