"""A chat answer through the OpenAI API frontend (`make serve` starts it on 127.0.0.1:9000) with the
official `openai` SDK, streamed as it is generated.

    .venv/bin/python client_examples/openai_chat.py "What is the capital of France?"
    .venv/bin/python client_examples/openai_chat.py "Name three colours." --no-stream --seed 1 --temperature 0.7
    .venv/bin/python client_examples/openai_chat.py "A person as JSON" --json-schema

--base-url (default http://127.0.0.1:9000/v1, or OPENAI_BASE_URL); --model (default: the first served
name, from GET /v1/models). Prints the answer on stdout; finish reason, usage and time on stderr. Any
OpenAI client works the same way. The key is the environment variable OPENAI_API_KEY, as for every
OpenAI SDK client: a server started with VLLM_API_KEY=... checks it (401 without the same key,
docs/security.md); without VLLM_API_KEY the server checks none and any string does.
"""

import argparse
import json
import os
import sys
import time

import openai

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:9000/v1"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--json-schema", action="store_true", help="constrain the answer to a small person schema")
    args = ap.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    model = args.model or client.models.list().data[0].id
    kw = dict(model=model, messages=[{"role": "user", "content": args.prompt}], max_tokens=args.max_tokens,
              temperature=args.temperature, seed=args.seed)
    if args.json_schema:
        kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    t0 = time.monotonic()
    try:
        if args.no_stream:
            r = client.chat.completions.create(**kw)
            print(r.choices[0].message.content)
            finish, usage = r.choices[0].finish_reason, r.usage
        else:
            finish = usage = None
            for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
                if chunk.choices:
                    print(chunk.choices[0].delta.content or "", end="", flush=True)
                    finish = chunk.choices[0].finish_reason or finish
                usage = chunk.usage or usage
            print(flush=True)
    except openai.APIStatusError as e:  # 400 bad parameter, 404 unknown model, 503 full / draining, 500
        print(f"error {e.status_code}: {json.dumps(e.body)}", file=sys.stderr)
        return 1
    except openai.APIConnectionError as e:
        print(f"cannot reach {args.base_url}: {e} (is `make serve` running?)", file=sys.stderr)
        return 1
    print(f"[{model}: finish_reason {finish}, {usage.prompt_tokens} prompt + {usage.completion_tokens} "
          f"completion tokens, {time.monotonic() - t0:.2f} s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
