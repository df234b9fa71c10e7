"""The requests the soak sends, built once and sent either way: `Payload.grpc_inputs()` (ensemble:
TensorRT-LLM tensor names, every tensor [1, 1]; llm: the vLLM-backend contract, every tensor [1],
sampling_parameters JSON) or `Payload.http_json()` (Triton's generate extension, plain scalars).
`make(model, rng, ...)` draws prompt and parameters: greedy or seeded sampling, short max_tokens,
optionally n = 2 (ensemble num_return_sequences) or guided JSON; a third of the `llm` requests name
one of the LoRA adapters the soak's repository serves (LORA_NAMES, set by run_soak)."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import tritonclient.grpc as grpcclient

from clients import ensemble_inputs, llm_inputs  # tests/support
from validate import Spec

PROMPTS = [
    "What is the capital of France?",
    "Explain photosynthesis in simple terms.",
    "Write a haiku about autumn leaves.",
    "How does a binary search work?",
    "Give me a short recipe for pancakes.",
    "Why is the sky blue?",
    "Name three colours.",
    "Once upon a time",
    "List four planets of the solar system.",
    "Translate 'Good morning' into Spanish.",
    "What does 谢谢 mean?",
    "Write three emojis that describe happiness.",
]
LORA_NAMES: tuple[str, ...] = ()  # adapters `llm` serves (repo.py); the requests' lora_name draws from them
JSON_PROMPTS = ["Describe a cat as a JSON object.", "Give me a JSON object with keys name and age.",
                "Reply in JSON: what is the capital of Italy?"]


@dataclasses.dataclass
class Payload:
    """One request: prompt, the model's parameters and the Spec its responses are checked against."""
    model: str
    text: str
    params: dict      # ensemble: tensor name -> value; llm: the sampling_parameters dict
    flags: dict       # llm only: exclude_input_in_output / return_* booleans
    spec: Spec

    def grpc_inputs(self) -> list:
        """tritonclient InferInputs (ensemble [1, 1], llm [1])."""
        if self.model == "ensemble":
            return ensemble_inputs(self.text, **self.params)
        return llm_inputs(self.text, self.spec.stream, json.dumps(self.params), **self.flags)

    def ref_key(self) -> str | None:
        """Same key = same greedy request whatever the protocol or streaming: its text must be the
        same (streamed deltas join to the non-streamed text). None for sampled requests."""
        if not self.spec.greedy or self.spec.n != 1:
            return None
        params = {k: v for k, v in self.params.items() if k not in ("stream", "exclude_input_in_output")}
        return json.dumps([self.model, self.text, params], sort_keys=True)

    def http_json(self) -> dict:
        """The same request as a generate / generate_stream JSON body."""
        if self.model == "ensemble":
            return {"text_input": self.text, **self.params}
        return {"text_input": self.text, "stream": self.spec.stream,
                "sampling_parameters": json.dumps(self.params), **self.flags}


def make(model: str, rng: random.Random, stream: bool = True, max_tokens: int | None = None,
         n: int = 1, guided: bool = False, long: bool = False) -> Payload:
    """A valid request for `model` (ensemble, llm or a copy of llm such as llm_tp2). long: enough
    tokens to stay in flight for seconds (min_tokens / ignore_eos hold EOS back)."""
    if max_tokens is None:  # a few values only, so that greedy requests repeat (reference texts)
        max_tokens = rng.randint(48, 64) if long else rng.choice((48, 80) if guided else (12, 24, 40))
    text = rng.choice(JSON_PROMPTS if guided else PROMPTS)
    greedy = n == 1 and rng.random() < 0.7
    if model == "ensemble":
        params: dict = {"max_tokens": max_tokens, "stream": stream, "apply_chat_template": rng.random() < 0.6 or guided}
        if not greedy:  # TensorRT-LLM: without top_k / top_p decoding is greedy
            params.update(temperature=0.8, top_p=0.9, seed=rng.randrange(1 << 31))
        else:
            params["temperature"] = 0.0
        if not stream:
            params["exclude_input_in_output"] = True
        if n > 1:
            params["num_return_sequences"] = n
        if guided:
            params["guided_decoding_guide_type"] = "json"
        if long:
            params["min_tokens"] = max_tokens
        spec = Spec("ensemble", max_tokens, stream, n=n, greedy=greedy, guided_json=guided, token_counts=True)
        return Payload(model, text, params, {}, spec)
    sp: dict = {"max_tokens": max_tokens}
    sp.update({"temperature": 0} if greedy else {"temperature": 0.8, "top_p": 0.9, "seed": rng.randrange(1 << 31)})
    if guided:
        sp["guided_decoding"] = {"json_object": True}
    if long:
        sp["ignore_eos"] = True
    if model == "llm" and LORA_NAMES and rng.random() < 0.34:
        sp["lora_name"] = rng.choice(LORA_NAMES)
    flags = {"return_finish_reason": True, "return_num_output_tokens": True}
    if not stream:
        flags["exclude_input_in_output"] = True
    spec = Spec(model, max_tokens, stream, greedy=greedy, guided_json=guided, finish_reason=True, token_counts=True)
    return Payload(model, text, sp, flags, spec)


def stop_inputs(model: str) -> list:
    """A TensorRT-LLM stop request: stop=true (and an empty text_input), sent under the request id
    of the request to stop."""
    shape = [1, 1] if model == "ensemble" else [1]
    t = grpcclient.InferInput("text_input", shape, "BYTES")
    t.set_data_from_numpy(np.array([b""], dtype=np.object_).reshape(shape))
    s = grpcclient.InferInput("stop", shape, "BOOL")
    s.set_data_from_numpy(np.ones(shape, dtype=np.bool_))
    return [t, s]
