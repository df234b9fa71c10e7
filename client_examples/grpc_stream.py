"""Stream an answer from the `ensemble` model over gRPC and print tokens as they arrive.

    .venv/bin/python client_examples/grpc_stream.py "What is the capital of France?" [--url 127.0.0.1:8001]

The ensemble takes TensorRT-LLM tensor names; one row per request here, so every input has shape [1, 1].
"""

import argparse
import queue
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient


def tensor(name, value, dtype):
    arr = np.array([[value]], dtype=dtype)
    t = grpcclient.InferInput(name, list(arr.shape), {np.object_: "BYTES", np.int32: "INT32",
                                                      np.float32: "FP32", np.bool_: "BOOL",
                                                      np.uint64: "UINT64"}[dtype])
    t.set_data_from_numpy(arr)
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("--url", default="127.0.0.1:8001")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--no-chat-template", action="store_true", help="send the prompt as raw text")
    args = ap.parse_args()

    inputs = [
        tensor("text_input", args.prompt.encode(), np.object_),
        tensor("max_tokens", args.max_tokens, np.int32),
        tensor("temperature", args.temperature, np.float32),
        tensor("stream", True, np.bool_),
        tensor("apply_chat_template", not args.no_chat_template, np.bool_),
    ]
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(args.url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    t0 = time.monotonic()
    client.async_stream_infer("ensemble", inputs, enable_empty_final_response=False)
    first = None
    try:
        while True:
            result, error = results.get(timeout=300)
            if error is not None:
                print(f"\nerror: {error}", file=sys.stderr)
                return 1
            if first is None:
                first = time.monotonic() - t0
            text = result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")
            print(text, end="", flush=True)
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    print(flush=True)
    print(f"[first text after {first:.3f} s, total {time.monotonic() - t0:.3f} s]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
