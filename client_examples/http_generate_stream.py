"""Stream an answer through Triton's HTTP generate_stream extension (Server-Sent Events) and print
each text delta as it arrives.

    .venv/bin/python client_examples/http_generate_stream.py "Write a haiku about the sea." [--url 127.0.0.1:8000]
    .venv/bin/python client_examples/http_generate_stream.py "Write a haiku about the sea." --model llm --temperature 0.7 --seed 1

`POST /v2/models/<model>/generate_stream` with a JSON body; the server answers `text/event-stream`,
one `data: {...}` event per model response, each carrying `text_output` (the new text only), and an
event with an `error` key if the request fails part-way.

--model ensemble (default): TensorRT-LLM names as JSON scalars, {"text_input": ..., "stream": true,
    "max_tokens": ..., "apply_chat_template": true}.
--model llm: the Triton vLLM-backend contract, {"text_input": ..., "stream": true,
    "sampling_parameters": "<JSON string>", "return_finish_reason": true, "return_num_output_tokens": true};
    the question is wrapped in the SmolLM2 / ChatML chat format by this client (the vLLM contract takes
    text as is) unless --no-chat-template.

Text goes to stdout; time to first delta, number of events and totals go to stderr. Only the standard
library is needed for HTTP.
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
        body = {"text_input": args.prompt, "stream": True, "max_tokens": args.max_tokens,
                "temperature": args.temperature, "apply_chat_template": not args.no_chat_template}
        if args.temperature > 0:  # TensorRT-LLM semantics: without top_k / top_p decoding is greedy
            body["top_p"] = args.top_p
        if args.seed is not None:
            body["seed"] = args.seed
        return body
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p}
    if args.seed is not None:
        sampling["seed"] = args.seed
    text = args.prompt if args.no_chat_template else chatml(args.prompt)
    return {"text_input": text, "stream": True, "sampling_parameters": json.dumps(sampling),
            "return_finish_reason": True, "return_num_output_tokens": True}


def first(value):
    while isinstance(value, list):
        if not value:
            return None
        value = value[0]
    return value


def iter_events(response):
    """Yield the JSON object of every `data:` line of an SSE response as soon as the line arrives."""
    while True:
        line = response.readline()
        if not line:
            return
        line = line.decode("utf-8").strip()
        if line.startswith("data:"):
            data = line[5:].strip()
            if data:
                yield json.loads(data)


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
    ap.add_argument("--timeout", type=float, default=300.0, help="socket timeout between events, seconds")
    args = ap.parse_args()

    url = f"http://{args.url}/v2/models/{args.model}/generate_stream"
    req = urllib.request.Request(url, data=json.dumps(build_payload(args)).encode("utf-8"), method="POST",
                                 headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    t0 = time.monotonic()
    first_at, events, tokens, reason = None, 0, 0, None
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as r:
            for ev in iter_events(r):
                if "error" in ev:
                    print(f"\nerror: {ev['error']}", file=sys.stderr)
                    return 1
                events += 1
                delta = first(ev.get("text_output")) or ""
                if delta and first_at is None:
                    first_at = time.monotonic() - t0
                print(delta, end="", flush=True)
                tokens += int(first(ev.get("num_output_tokens")) or 0)
                reason = first(ev.get("finish_reason")) or reason
    except urllib.error.HTTPError as e:
        raw = e.read().decode("utf-8", errors="replace").strip()
        try:  # the error body is itself an SSE event: data: {"error": "..."}
            raw = json.loads(raw[5:] if raw.startswith("data:") else raw).get("error", raw)
        except ValueError:
            pass
        print(f"error (HTTP {e.code}): {raw}", file=sys.stderr)
        return 1
    total = time.monotonic() - t0
    info = [f"{events} events", f"first text after {first_at:.3f} s" if first_at is not None else "no text",
            f"total {total:.3f} s"]
    if args.model == "llm":
        info += [f"{tokens} output tokens", f"finish_reason {reason}"]
    print(f"\n[{', '.join(info)}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
