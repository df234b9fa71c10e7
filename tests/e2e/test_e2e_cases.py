"""Known failure modes of LLM serving, against the real tritonserver: U+FFFD from multi-byte
characters split across tokens, lost word-boundary spaces when streaming, EOS ignored without an
explicit end_id, prompts over max_model_len, a silent max_tokens default, max_tokens 0 / 1 and empty
prompts (the metrics are in test_e2e_metrics.py). Every case runs through the TensorRT-LLM-style
`ensemble` and, where it needs finish_reason or token counts, through `llm` directly (vLLM contract)."""

from __future__ import annotations

import json

import pytest

from clients import GrpcStream, decode_str, ensemble_inputs, ensemble_stream, llm_stream
from http_clients import http_generate, http_generate_stream, server_ready

pytestmark = pytest.mark.e2e

REPLACEMENT = "\ufffd"
GREEDY = {"temperature": "0"}
COUNTS = dict(return_finish_reason=True, return_num_output_tokens=True, return_num_input_tokens=True)


def finish_reason(r) -> str:
    return decode_str(r.responses[-1], "finish_reason")


def num_output_tokens(r) -> int:
    return int(r.last("num_output_tokens").reshape(-1)[0])


def assert_grpc_invalid(r, *names):
    assert r.error is not None, f"expected an error naming {names}, got text {r.text!r}"
    msg = str(r.error)
    for n in names:
        assert n in msg, f"error should name {n!r}: {msg}"
    assert not r.responses, "an invalid request must not produce output"
    return msg


def assert_http_invalid(r, *names):
    """INVALID_ARG is HTTP 400 on Triton's generate endpoints."""
    assert r.status == 400, f"expected 400 (INVALID_ARG), got {r.status}: {r.body or r.error}"
    for n in names:
        assert n in (r.error or ""), f"error should name {n!r}: {r.error}"
    return r.error


def logprob_entries(r) -> list[tuple[int, dict]]:
    """(token id, entry) of every generated token, over all responses (return_logprobs with a
    `logprobs` count: without one the output is JSON null, as from the vLLM backend)."""
    out = []
    for arr in r.all("logprobs"):
        for d in json.loads(arr.reshape(-1)[0]):
            # the sampled token is the first key (alternatives follow)
            tok = next(iter(d))
            out.append((int(tok), d[tok]))
    return out


# -- no U+FFFD from multi-byte characters split across byte tokens ---------------------------------

SPLIT_CHAR_PROMPTS = ["What does 谢谢 mean?", "Write three emojis that describe happiness."]


@pytest.mark.parametrize("prompt", SPLIT_CHAR_PROMPTS, ids=["cjk", "emoji"])
def test_ensemble_stream_has_no_replacement_char_and_matches_non_streamed(triton_server, prompt):
    url = triton_server.grpc_url
    params = dict(apply_chat_template=True, temperature=0.0, max_tokens=32)
    s = ensemble_stream(url, prompt, stream=True, **params).raise_for_error()
    deltas = s.texts()
    bad = [d for d in deltas if REPLACEMENT in d]
    assert not bad, f"U+FFFD in streamed deltas {bad!r} (all: {deltas!r})"
    joined = "".join(deltas)
    assert any(ord(c) > 127 for c in joined), f"answer has no non-ASCII character, test not meaningful: {joined!r}"
    n = ensemble_stream(url, prompt, stream=False, exclude_input_in_output=True, **params).raise_for_error()
    assert REPLACEMENT not in n.text
    assert joined == n.text

    h = http_generate_stream(triton_server.http_base, "ensemble",
                             {"text_input": prompt, "stream": True, "apply_chat_template": True,
                              "temperature": 0.0, "max_tokens": 32})
    assert h.status == 200 and h.error is None, h.error
    assert not [e for e in h.events if REPLACEMENT in e["text_output"]]
    assert h.text == joined


def test_llm_stream_byte_tokens_are_joined_before_sending(triton_server, chat_prompt, tokenizer):
    """The answer's CJK character is made of byte tokens (each alone decodes to U+FFFD); the stream
    never shows those halves, and the joined deltas equal the tokenizer's decode of all tokens."""
    prompt = chat_prompt(SPLIT_CHAR_PROMPTS[0])
    r = llm_stream(triton_server.grpc_url, prompt, stream=True,
                   sampling_parameters=dict(GREEDY, max_tokens="24", logprobs="0"), return_logprobs=True).raise_for_error()
    deltas = r.texts()
    assert not [d for d in deltas if REPLACEMENT in d], deltas
    entries = logprob_entries(r)
    ids = [t for t, _ in entries]
    split = [e["decoded_token"] for _, e in entries if REPLACEMENT in e["decoded_token"]]
    assert split, "no byte-level token in the answer: the test would not exercise split characters"
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert any(ord(c) > 127 for c in "".join(deltas))


# -- SentencePiece / byte-level BPE word boundaries kept in streaming ------------------------------

def test_ensemble_stream_keeps_spaces(triton_server):
    url = triton_server.grpc_url
    prompt = "Write two sentences about cats."
    params = dict(apply_chat_template=True, temperature=0.0, max_tokens=32)
    s = ensemble_stream(url, prompt, stream=True, **params).raise_for_error()
    deltas = s.texts()
    joined = "".join(deltas)
    n = ensemble_stream(url, prompt, stream=False, exclude_input_in_output=True, **params).raise_for_error()
    assert joined == n.text
    words = joined.split()
    assert len(words) >= 10 and joined.count(" ") >= 9, f"spaces missing between words: {joined!r}"
    assert sum(1 for d in deltas if d.startswith(" ")) >= 5, f"no delta starts with a space: {deltas!r}"
    assert all(len(w) < 20 for w in words), f"words glued together: {joined!r}"


def test_llm_stream_keeps_spaces_and_equals_decode(triton_server, tokenizer):
    r = llm_stream(triton_server.grpc_url, "Once upon a time", stream=True,
                   sampling_parameters=dict(GREEDY, max_tokens="16", logprobs="0"), return_logprobs=True).raise_for_error()
    deltas = r.texts()
    ids = [t for t, _ in logprob_entries(r)]
    assert len(ids) == 16
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert sum(1 for d in deltas if d.startswith(" ")) >= 5, deltas
    n = llm_stream(triton_server.grpc_url, "Once upon a time", stream=False,
                   sampling_parameters=dict(GREEDY, max_tokens="16"), exclude_input_in_output=True)
    assert n.raise_for_error().text == "".join(deltas)


# -- EOS from generation_config when the client sends no end_id / stop_token_ids -------------------

EOS_QUESTION = "What is the capital of France?"
NEVER_TOKEN = 49151  # last vocabulary id: never produced for this prompt


def test_ensemble_stops_at_eos_without_end_id(triton_server):
    url = triton_server.grpc_url
    base = dict(apply_chat_template=True, temperature=0.0, stream=False, exclude_input_in_output=True,
                return_log_probs=True)
    r = ensemble_stream(url, EOS_QUESTION, max_tokens=32, **base).raise_for_error()
    n_default = r.last("output_log_probs").size
    assert 0 < n_default < 32, f"did not stop at EOS: {n_default} tokens, {r.text!r}"
    assert "Paris" in r.text
    # With an end_id that never appears, the same request runs past the model's EOS to max_tokens.
    r2 = ensemble_stream(url, EOS_QUESTION, max_tokens=n_default + 4, end_id=NEVER_TOKEN, **base).raise_for_error()
    assert r2.last("output_log_probs").size == n_default + 4
    assert r2.text.startswith(r.text) and len(r2.text) > len(r.text), (r.text, r2.text)


def test_llm_finish_reason_stop_without_stop_token_ids(triton_server, chat_prompt):
    prompt = chat_prompt(EOS_QUESTION)
    r = llm_stream(triton_server.grpc_url, prompt, stream=False, exclude_input_in_output=True,
                   sampling_parameters=dict(GREEDY, max_tokens="32"), **COUNTS).raise_for_error()
    assert finish_reason(r) == "stop"
    n_default = num_output_tokens(r)
    assert n_default < 32
    assert "Paris" in r.text
    r2 = llm_stream(triton_server.grpc_url, prompt, stream=False, exclude_input_in_output=True,
                    sampling_parameters=dict(GREEDY, max_tokens=str(n_default + 4), end_id=str(NEVER_TOKEN)),
                    **COUNTS).raise_for_error()
    assert finish_reason(r2) == "length"
    assert num_output_tokens(r2) == n_default + 4
    # streaming reports the same finish reason
    s = llm_stream(triton_server.grpc_url, prompt, stream=True,
                   sampling_parameters=dict(GREEDY, max_tokens="32"), **COUNTS).raise_for_error()
    assert finish_reason(s) == "stop"
    assert s.text == r.text


# -- prompts over max_model_len --------------------------------------------------------------------

def _prompt_of(n_tokens: int, count_tokens) -> str:
    """A prompt of exactly n_tokens tokens built from a repeated word."""
    k = n_tokens
    for _ in range(20):
        text = "hello" + " hello" * (k - 1)
        got = count_tokens(text)
        if got == n_tokens:
            return text
        k += n_tokens - got
    raise AssertionError(f"could not build a prompt of {n_tokens} tokens")


@pytest.fixture(scope="module")
def long_prompts(max_model_len, count_tokens):
    return {"over": _prompt_of(max_model_len + 1, count_tokens),
            "near": _prompt_of(max_model_len - 1, count_tokens)}


def test_long_prompts_rejected_while_other_requests_keep_running(triton_server, long_prompts, max_model_len):
    url, http = triton_server.grpc_url, triton_server.http_base
    normal = dict(apply_chat_template=True, temperature=0.0, max_tokens=32)
    q = "Name three colors."
    solo = ensemble_stream(url, q, stream=True, **normal).raise_for_error().text

    running = GrpcStream(url, "ensemble", ensemble_inputs(q, stream=True, **normal))
    first, err = running.next()
    assert err is None, err
    try:
        over, near = long_prompts["over"], long_prompts["near"]
        n_over, n_near = max_model_len + 1, max_model_len - 1
        # prompt of max_model_len + 1 tokens: the prompt is to blame (text_input, both counts), not
        # the max_tokens the client sent
        too_long = f"text_input: the prompt has {n_over} tokens, more than max_model_len {max_model_len}"
        for r in (ensemble_stream(url, over, stream=True, max_tokens=8),
                  llm_stream(url, over, stream=True, sampling_parameters={"max_tokens": "8"})):
            msg = assert_grpc_invalid(r, "text_input")
            assert too_long in msg and "max_tokens" not in msg, msg
        for model, payload in (("ensemble", {"text_input": over, "max_tokens": 8}),
                               ("llm", {"text_input": over, "sampling_parameters": '{"max_tokens": "8"}'}),
                               ("llm", {"text_input": over})):
            msg = assert_http_invalid(http_generate(http, model, payload), "text_input")
            assert too_long in msg and "max_tokens" not in msg, msg
        # prompt of max_model_len - 1 tokens with max_tokens 10: names max_tokens
        for r in (ensemble_stream(url, near, stream=True, max_tokens=10),
                  llm_stream(url, near, stream=True, sampling_parameters={"max_tokens": "10"})):
            msg = assert_grpc_invalid(r, "max_tokens")
            assert str(n_near) in msg and str(max_model_len) in msg, msg
        assert_http_invalid(http_generate(http, "llm", {"text_input": near,
                                                        "sampling_parameters": '{"max_tokens": "10"}'}),
                            "max_tokens")
        assert_http_invalid(http_generate_stream(http, "ensemble", {"text_input": near, "max_tokens": 10,
                                                                    "stream": True}), "max_tokens")
    finally:
        rest = running.collect()
    rest.raise_for_error()
    first_text = decode_str(first, "text_output")
    assert first_text + rest.text == solo, "the stream in flight was disturbed by the bad requests"
    assert server_ready(http)


def test_a_prompt_of_megabytes_is_refused_before_tokenizing_on_both_models(triton_server):
    """4 MB of text cannot fit in any max_model_len of this model: refused at once naming text_input
    (tokenizing 50 MB took the preprocessing stub 85 s before the byte bound), over gRPC and HTTP."""
    url, http = triton_server.grpc_url, triton_server.http_base
    huge = "lorem ipsum " * (4 * 1024 * 1024 // 12)
    for r in (ensemble_stream(url, huge, stream=True, max_tokens=4),
              llm_stream(url, huge, stream=True, sampling_parameters={"max_tokens": "4"})):
        msg = assert_grpc_invalid(r, "text_input")
        assert f"too long: {len(huge)} bytes cannot fit in max_" in msg, msg
    for model, payload in (("ensemble", {"text_input": huge, "max_tokens": 4}),
                           ("llm", {"text_input": huge, "sampling_parameters": '{"max_tokens": "4"}'})):
        msg = assert_http_invalid(http_generate(http, model, payload), "text_input")
        assert "too long" in msg, msg
    assert server_ready(http)


# -- max_tokens absent -> until EOS (never a silent 16) --------------------------------------------

UNTIL_EOS_PROMPT = "Write two sentences about cats."


def test_llm_without_max_tokens_runs_to_eos(triton_server, chat_prompt):
    r = llm_stream(triton_server.grpc_url, chat_prompt(UNTIL_EOS_PROMPT), stream=False, exclude_input_in_output=True,
                   sampling_parameters=GREEDY, timeout=300, **COUNTS).raise_for_error()
    assert num_output_tokens(r) > 16, f"output cut at {num_output_tokens(r)} tokens: {r.text!r}"
    assert finish_reason(r) == "stop"
    assert r.text.rstrip().endswith((".", "!", "?")), r.text


def test_ensemble_without_max_tokens_runs_to_eos(triton_server):
    s = ensemble_stream(triton_server.grpc_url, UNTIL_EOS_PROMPT, stream=True, apply_chat_template=True,
                        temperature=0.0, return_log_probs=True, timeout=300).raise_for_error()
    n_tokens = sum(a.size for a in s.all("output_log_probs"))
    assert n_tokens > 16, f"output cut at {n_tokens} tokens: {s.text!r}"
    assert s.text.rstrip().endswith((".", "!", "?")), s.text


# -- max_tokens 1 / 0, empty prompt ----------------------------------------------------------------

EOS_FIRST_PROMPT = "What is the capital of France?"  # raw (no chat template): SmolLM2 answers EOS at once


@pytest.mark.parametrize("stream", [False, True], ids=["non_streamed", "streamed"])
def test_llm_max_tokens_1_min_tokens_1(triton_server, stream):
    url = triton_server.grpc_url
    # without min_tokens the first token is EOS (finish "stop"): min_tokens=1 must suppress it
    base = llm_stream(url, EOS_FIRST_PROMPT, stream=False, exclude_input_in_output=True,
                      sampling_parameters=dict(GREEDY, max_tokens="1"), **COUNTS).raise_for_error()
    assert finish_reason(base) == "stop" and num_output_tokens(base) == 1
    r = llm_stream(url, EOS_FIRST_PROMPT, stream=stream, exclude_input_in_output=True if not stream else None,
                   sampling_parameters=dict(GREEDY, max_tokens="1", min_tokens="1", logprobs="0"),
                   return_logprobs=True, **COUNTS).raise_for_error()
    assert finish_reason(r) == "length"
    assert sum(int(a.reshape(-1)[0]) for a in r.all("num_output_tokens")) == 1
    entries = logprob_entries(r)
    assert len(entries) == 1 and entries[0][0] != 2, entries  # one token, not EOS (<|im_end|> = 2)


def test_ensemble_max_tokens_1_min_tokens_1(triton_server):
    url = triton_server.grpc_url
    params = dict(apply_chat_template=True, temperature=0.0)
    full = ensemble_stream(url, "What is the capital of France?", stream=True, max_tokens=8, **params)
    first_delta = full.raise_for_error().texts()[0]
    r = ensemble_stream(url, "What is the capital of France?", stream=False, exclude_input_in_output=True,
                        max_tokens=1, min_tokens=1, return_log_probs=True, **params).raise_for_error()
    assert r.last("output_log_probs").size == 1
    assert r.text == first_delta
    # the older TensorRT-LLM name min_length works the same
    r2 = ensemble_stream(url, "What is the capital of France?", stream=False, exclude_input_in_output=True,
                         max_tokens=1, min_length=1, return_log_probs=True, **params).raise_for_error()
    assert r2.last("output_log_probs").size == 1 and r2.text == first_delta


def test_max_tokens_0_is_invalid_arg(triton_server):
    url, http = triton_server.grpc_url, triton_server.http_base
    assert_grpc_invalid(ensemble_stream(url, "Hello", stream=True, max_tokens=0), "max_tokens")
    assert_grpc_invalid(llm_stream(url, "Hello", stream=True, sampling_parameters={"max_tokens": "0"}),
                        "max_tokens")
    assert_http_invalid(http_generate(http, "ensemble", {"text_input": "Hello", "max_tokens": 0}), "max_tokens")
    assert_http_invalid(http_generate(http, "llm", {"text_input": "Hello",
                                                    "sampling_parameters": '{"max_tokens": "0"}'}), "max_tokens")
    assert_grpc_invalid(ensemble_stream(url, "Hello", stream=True, max_tokens=-3), "max_tokens")


def test_empty_text_input_is_invalid_arg(triton_server):
    url, http = triton_server.grpc_url, triton_server.http_base
    assert_grpc_invalid(ensemble_stream(url, "", stream=True, max_tokens=4), "text_input")
    assert_grpc_invalid(llm_stream(url, "", stream=True, sampling_parameters={"max_tokens": "4"}), "text_input")
    assert_http_invalid(http_generate(http, "ensemble", {"text_input": "", "max_tokens": 4}), "text_input")
    assert_http_invalid(http_generate(http, "llm", {"text_input": "",
                                                    "sampling_parameters": '{"max_tokens": "4"}'}), "text_input")
    assert_http_invalid(http_generate_stream(http, "ensemble", {"text_input": "", "max_tokens": 4,
                                                                "stream": True}), "text_input")


@pytest.mark.parametrize("params, field", [
    (dict(temperature=float("inf")), "temperature"),  # greedy (no top_k / top_p): was accepted
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf"), top_k=5), "temperature"),  # was "sampling_parameters.temperature"
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),  # was "sampling_parameters.repetition_penalty"
    (dict(top_p=float("nan"), top_k=5), "top_p"),
    (dict(presence_penalty=float("-inf")), "presence_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(length_penalty=float("nan")), "length_penalty"),
], ids=["temperature_inf_greedy", "temperature_nan", "temperature_inf_top_k", "repetition_penalty_inf",
        "top_p_nan", "presence_penalty_-inf", "frequency_penalty_nan", "length_penalty_nan"])
def test_ensemble_non_finite_floats_are_invalid_arg_naming_the_tensor(triton_server, params, field):
    """gRPC only: JSON has no inf / NaN, so HTTP clients cannot send them."""
    r = ensemble_stream(triton_server.grpc_url, "Hello", max_tokens=4, **params)
    msg = assert_grpc_invalid(r, field)
    assert f"{field}: must be a finite number" in msg and "sampling_parameters" not in msg, msg


@pytest.mark.parametrize("key", ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                                 "frequency_penalty"])
def test_llm_non_finite_floats_are_invalid_arg_naming_the_key(triton_server, key):
    for value in ("inf", "nan"):
        r = llm_stream(triton_server.grpc_url, "Hello", stream=True,
                       sampling_parameters={key: value, "max_tokens": "4"})
        msg = assert_grpc_invalid(r, f"sampling_parameters.{key}")
        assert "must be a finite number" in msg, msg
    h = http_generate(triton_server.http_base, "llm",
                      {"text_input": "Hello", "sampling_parameters": f'{{"{key}": "inf"}}'})
    assert "must be a finite number" in assert_http_invalid(h, f"sampling_parameters.{key}")


def _deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_malformed_shapes_of_input_name_the_input(triton_server):
    """What a client's mistakes in shape answered before: `ensemble` without text_input a raw KeyError;
    sampling_parameters nested 20,000 deep a bare RecursionError; a guide schema nested too deep an
    error naming the internal model preprocessing_0_0. Each now names the input, on both protocols."""
    url, http = triton_server.grpc_url, triton_server.http_base
    no_text = [i for i in ensemble_inputs("x", max_tokens=4, stream=True) if i.name() != "text_input"]
    r = GrpcStream(url, "ensemble", no_text).collect()
    assert r.error is not None and "text_input" in str(r.error) and "KeyError" not in str(r.error), r.error
    deep = "[" * 20000 + "]" * 20000
    msg = assert_grpc_invalid(llm_stream(url, "Hello", stream=True, sampling_parameters=f'{{"stop": {deep}}}'),
                              "sampling_parameters")
    assert "RecursionError" not in msg and "nested" in msg, msg
    msg = assert_http_invalid(http_generate(http, "llm", {"text_input": "Hello", "sampling_parameters": deep}),
                              "sampling_parameters")
    guide = json.dumps(_deep_schema(200))
    r = ensemble_stream(url, "Hello", stream=True, max_tokens=4, guided_decoding_guide_type="json_schema",
                        guided_decoding_guide=guide)
    msg = assert_grpc_invalid(r, "guided_decoding_guide")
    assert "preprocessing_0_0" not in msg and "nested more than" in msg, msg
    assert_http_invalid(http_generate(http, "ensemble", {"text_input": "Hello", "max_tokens": 4,
                                                         "guided_decoding_guide_type": "json_schema",
                                                         "guided_decoding_guide": guide}), "guided_decoding_guide")
    assert server_ready(http)


@pytest.mark.parametrize("params, field", [
    (dict(top_p=1.5), "top_p"),
    (dict(temperature=-1.0, top_k=5), "temperature"),
    (dict(temperature=-1.0), "temperature"),  # no top_k / top_p: TensorRT-LLM greedy default
    (dict(beam_width=2), "beam_width"),
    (dict(num_return_sequences=0), "num_return_sequences"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(end_id=10**6), "end_id"),
], ids=["top_p_1.5", "temperature_neg_top_k", "temperature_neg_only", "beam_width_2", "num_return_sequences_0",
        "repetition_penalty_0", "end_id_out_of_vocab"])
def test_other_ensemble_errors_name_the_tensor(triton_server, params, field):
    r = ensemble_stream(triton_server.grpc_url, "Hello", max_tokens=4, **params)
    assert_grpc_invalid(r, field)
    h = http_generate(triton_server.http_base, "ensemble", dict({"text_input": "Hello", "max_tokens": 4}, **params))
    assert_http_invalid(h, field)


# -- TensorRT-LLM parameters on the ensemble -------------------------------------------------------

def test_ensemble_stop_words_cut_the_text_in_both_modes(triton_server):
    url = triton_server.grpc_url
    base = dict(temperature=0.0, max_tokens=16)
    free = ensemble_stream(url, "1, 2, 3, 4,", stream=False, exclude_input_in_output=True, **base)
    assert free.raise_for_error().text.startswith(" 5, 6, 7, 8,"), free.text
    n = ensemble_stream(url, "1, 2, 3, 4,", stream=False, exclude_input_in_output=True,
                        stop_words=["zzz", "6, 7"], **base).raise_for_error()
    assert n.text == " 5, "
    s = ensemble_stream(url, "1, 2, 3, 4,", stream=True, stop_words=["zzz", "6, 7"], **base).raise_for_error()
    assert s.text == " 5, "


def test_ensemble_seed_gives_identical_sampled_text(triton_server):
    url = triton_server.grpc_url
    params = dict(stream=False, exclude_input_in_output=True, temperature=1.0, top_k=50, top_p=1.0, max_tokens=16)
    a = ensemble_stream(url, "Once upon a time", seed=77, **params).raise_for_error().text
    b = ensemble_stream(url, "Once upon a time", seed=77, **params).raise_for_error().text
    c = ensemble_stream(url, "Once upon a time", random_seed=77, **params).raise_for_error().text
    assert a == b == c
    others = {ensemble_stream(url, "Once upon a time", seed=s, **params).raise_for_error().text for s in (1, 2, 3)}
    assert others - {a}, "different seeds all gave the same text: sampling does not use the seed"


# -- last: bad input never kills the server --------------------------------------------------------

def test_zz_server_still_serves_after_bad_input(triton_server):
    assert server_ready(triton_server.http_base)
    r = ensemble_stream(triton_server.grpc_url, "What is the capital of France?", stream=True,
                        apply_chat_template=True, temperature=0.0, max_tokens=16).raise_for_error()
    assert "Paris" in r.text
