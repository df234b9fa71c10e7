"""Guided decoding (llguidance): the contracts' parsing and checks (vLLM guided_decoding /
structured_outputs, TensorRT-LLM guided_decoding_guide_type / guided_decoding_guide), and the
engine on the tiny random Llama: with random weights the text means nothing, so these tests only
show that every output obeys its guide (regex, choice, grammar, JSON schema; greedy and sampled),
that a finished guide ends the request with "stop", that unguided requests in the same batch are
unaffected, and that ids past the tokenizer's vocabulary are never chosen."""

from __future__ import annotations

import json
import re
import shutil
import threading

import numpy as np
import pytest

from test_engine_tiny import make_engine, prompt, run

from paddle_llm_engine import InvalidRequestError, SamplingParams
from paddle_llm_engine.guided import GuidedDecoding, GuideSpec
from paddle_llm_triton.contracts import guided as G
from paddle_llm_triton.contracts import trtllm
from paddle_llm_triton.contracts.vllm import from_vllm_json, to_json

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "n": {"type": "integer", "minimum": 0, "maximum": 999},
                         "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "n", "ok"], "additionalProperties": False}


def validate(value, schema) -> None:
    """A small JSON-schema check for the keywords the tests use; raises AssertionError."""
    t = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    if t == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
    elif t is not None:
        assert isinstance(value, types[t]), (value, t)
    if "enum" in schema:
        assert value in schema["enum"], value
    if "maxLength" in schema:
        assert len(value) <= schema["maxLength"], value
    if "minimum" in schema:
        assert value >= schema["minimum"], value
    if "maximum" in schema:
        assert value <= schema["maximum"], value
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            assert k in value, (k, value)
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(props), value
        for k, v in value.items():
            if k in props:
                validate(v, props[k])
    if isinstance(value, list):
        if "maxItems" in schema:
            assert len(value) <= schema["maxItems"], value
        for v in value:
            validate(v, schema.get("items", {}))


# -- contracts ------------------------------------------------------------------------------------

def vllm(body: dict):
    return from_vllm_json(json.dumps(body))


@pytest.mark.parametrize("key", G.VLLM_GUIDE_KEYS)
def test_vllm_keys_parse_each_kind_as_object_or_string(key):
    cases = {"json": (SCHEMA, "json_schema"), "regex": (r"[0-9]+", "regex"), "choice": (["x", "y"], "choice"),
             "grammar": ('root ::= "a" | "b"', "grammar"), "json_object": (True, "json_object")}
    for k, (v, kind) in cases.items():
        for value in ({k: v}, json.dumps({k: v})):  # the Triton vLLM backend accepts both forms
            g = vllm({key: value}).guide
            assert g.kind == kind and g.field == f"sampling_parameters.{key}.{k}"
    g = vllm({key: {"json": json.dumps(SCHEMA), "disable_any_whitespace": True,
                    "disable_additional_properties": "true", "whitespace_pattern": " ?", "backend": "xgrammar",
                    "disable_fallback": True}}).guide
    assert json.loads(g.value) == SCHEMA and not g.whitespace_flexible and not g.additional_properties
    assert g.whitespace_pattern == " ?"
    assert vllm({key: {"backend": "auto"}}).guide is None  # no constraint given: unguided, as vLLM
    assert vllm({key: {"json_object": False}}).guide is None


@pytest.mark.parametrize("body, field", [
    ({"guided_decoding": {"json": "{not json"}}, "sampling_parameters.guided_decoding.json"),
    ({"guided_decoding": {"json": {"type": "nonsense"}}}, "sampling_parameters.guided_decoding.json"),
    ({"structured_outputs": {"json": [1, 2]}}, "sampling_parameters.structured_outputs.json"),
    ({"structured_outputs": {"regex": "(["}}, "sampling_parameters.structured_outputs.regex"),
    ({"structured_outputs": {"regex": 5}}, "sampling_parameters.structured_outputs.regex"),
    ({"guided_decoding": {"grammar": "root ::= (("}}, "sampling_parameters.guided_decoding.grammar"),
    ({"guided_decoding": {"grammar": "start: x\nx: 'a'"}}, "sampling_parameters.guided_decoding.grammar"),
    ({"guided_decoding": {"choice": []}}, "sampling_parameters.guided_decoding.choice"),
    ({"guided_decoding": {"choice": ["a", 1]}}, "sampling_parameters.guided_decoding.choice"),
    ({"guided_decoding": {"regex": "a", "choice": ["a"]}}, "sampling_parameters.guided_decoding"),
    ({"guided_decoding": {"regexp": "a"}}, "sampling_parameters.guided_decoding.regexp"),
    ({"guided_decoding": {"structural_tag": "{}"}}, "sampling_parameters.guided_decoding.structural_tag"),
    ({"guided_decoding": {"regex": "a", "disable_any_whitespace": "maybe"}},
     "sampling_parameters.guided_decoding.disable_any_whitespace"),
    ({"guided_decoding": "[1]"}, "sampling_parameters.guided_decoding"),
    ({"guided_decoding": "{bad"}, "sampling_parameters.guided_decoding"),
    ({"guided_decoding": {"regex": "a"}, "structured_outputs": {"regex": "b"}}, "sampling_parameters.guided_decoding"),
])
def test_vllm_bad_guides_name_the_field(body, field):
    with pytest.raises(InvalidRequestError) as e:
        vllm(body)
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(field + ":")


def test_unknown_reasons_are_distinct():
    with pytest.raises(InvalidRequestError, match="not implemented"):
        vllm({"guided_decoding": {"structural_tag": "{}"}})
    with pytest.raises(InvalidRequestError, match="unknown key"):
        vllm({"guided_decoding": {"jsn": {}}})


@pytest.mark.parametrize("body", [
    {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True, "disable_additional_properties": True}},
    {"guided_decoding": {"regex": r"\d+", "whitespace_pattern": " "}},
    {"guided_decoding": {"choice": ["a", "b\"c", "é"]}},
    {"guided_decoding": {"grammar": 'root ::= "yes" | "no"'}},
    {"guided_decoding": {"json_object": True}, "temperature": 0.5},
])
def test_to_json_round_trips_the_guide(body):
    """The ensemble passes its params to llm as sampling_parameters JSON: the guide must survive."""
    p = vllm(body)
    q = from_vllm_json(to_json(p))
    assert q.guide is not None
    for attr in ("kind", "value", "whitespace_flexible", "whitespace_pattern", "additional_properties"):
        assert getattr(q.guide, attr) == getattr(p.guide, attr)
    assert q.temperature == p.temperature


def tr(**values):
    return trtllm.from_trtllm_tensors(values, 49152)


def test_trtllm_guide_types():
    assert tr().guide is None
    assert tr(guided_decoding_guide_type="").guide is None
    g = tr(guided_decoding_guide_type="json")
    assert g.guide.kind == "json_schema" and g.guide.value == G.TRTLLM_ANY_JSON  # any object or array, bounded
    assert tr(guided_decoding_guide_type="json_schema", guided_decoding_guide=json.dumps(SCHEMA)).guide.kind == "json_schema"
    assert tr(guided_decoding_guide_type="regex", guided_decoding_guide="[a-z]+").guide.kind == "regex"
    g = tr(guided_decoding_guide_type="ebnf_grammar", guided_decoding_guide="root ::= [0-9]+").guide
    assert g.kind == "grammar" and g.field == "guided_decoding_guide"
    # the guide travels to llm inside sampling_parameters
    assert from_vllm_json(to_json(tr(guided_decoding_guide_type="regex", guided_decoding_guide="[a-z]+"))).guide.value == "[a-z]+"


@pytest.mark.parametrize("values, field, words", [
    (dict(guided_decoding_guide_type="xml", guided_decoding_guide="x"), "guided_decoding_guide_type", "unknown guide type"),
    (dict(guided_decoding_guide="[a-z]+"), "guided_decoding_guide_type", "required"),
    (dict(guided_decoding_guide_type="regex"), "guided_decoding_guide", "required"),
    (dict(guided_decoding_guide_type="json_schema", guided_decoding_guide="{"), "guided_decoding_guide", "JSON"),
    (dict(guided_decoding_guide_type="json_schema", guided_decoding_guide='{"type": 3}'), "guided_decoding_guide", ""),
    (dict(guided_decoding_guide_type="regex", guided_decoding_guide="a{2"), "guided_decoding_guide", "regex"),
    (dict(guided_decoding_guide_type="ebnf_grammar", guided_decoding_guide="root ::= undefined_rule"), "guided_decoding_guide",
     "undefined_rule"),
])
def test_trtllm_bad_guides_name_the_tensor(values, field, words):
    with pytest.raises(InvalidRequestError) as e:
        tr(**values)
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_trtllm_tensor_values_reads_the_guide_tensors():
    class Req:
        def __init__(self, d):
            self.d = d

    import sys
    import types

    class Tensor:
        def __init__(self, arr):
            self.arr = arr

        def as_numpy(self):
            return self.arr

    fake = types.ModuleType("triton_python_backend_utils")
    fake.get_input_tensor_by_name = lambda req, name: Tensor(req.d[name]) if name in req.d else None
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = fake
    try:
        values = trtllm.tensor_values(Req({
            "guided_decoding_guide_type": np.array([[b"regex"]], dtype=np.object_),
            "guided_decoding_guide": np.array([[b"[0-9]{3}"]], dtype=np.object_)}))
    finally:
        if saved is None:
            del sys.modules["triton_python_backend_utils"]
        else:
            sys.modules["triton_python_backend_utils"] = saved
    assert values == {"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[0-9]{3}"}


# -- engine ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = make_engine(tiny_model_dir)
    yield eng
    for rid in list(eng.requests):
        eng.abort_request(rid)


def params(guide: GuideSpec | None, n: int = 40, temperature: float = 0.0, **kw) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=n, guide=guide, **kw)


REGEX = r"[a-z]{2,8}-[0-9]{2}"
CHOICES = ["red", "green", "blue"]


def test_guides_hold_greedy_and_sampled_mixed_with_unguided(engine):
    """Regex, choice, grammar and JSON requests, greedy and sampled, in one batch with unguided
    ones: every guided output obeys its guide and ends with "stop"; the unguided ones give exactly
    the tokens they give alone."""
    free = {f"free{i}": (prompt(9 + i, salt=40 + i), params(None, 24, ignore_eos=True)) for i in range(2)}
    alone = {rid: run(engine, {rid: r})[rid]["tokens"] for rid, r in free.items()}
    reqs = dict(free)
    for t in (0.0, 1.0):
        for s in range(3):
            kw = dict(temperature=t, seed=100 + s) if t else {}
            salt = s + (10 if t else 0)
            reqs[f"re{t}{s}"] = (prompt(10, salt), params(GuideSpec("regex", REGEX), **kw))
            reqs[f"ch{t}{s}"] = (prompt(12, salt + 1), params(GuideSpec("choice", json.dumps(CHOICES)), **kw))
            reqs[f"gr{t}{s}"] = (prompt(11, salt + 2), params(GuideSpec("grammar", 'root ::= ("yes" | "no") "!"'), **kw))
            reqs[f"js{t}{s}"] = (prompt(14, salt + 3), params(
                GuideSpec("json_schema", json.dumps(SCHEMA), whitespace_flexible=False), 80, **kw))
    res = run(engine, reqs)
    for rid, free_tokens in alone.items():
        assert res[rid]["tokens"] == free_tokens, rid
    for rid, r in res.items():
        if rid.startswith("free"):
            continue
        assert r["reason"] == "stop", (rid, r["text"])
        text = r["text"]
        if rid.startswith("re"):
            assert re.fullmatch(REGEX, text), (rid, text)
        elif rid.startswith("ch"):
            assert text in CHOICES, (rid, text)
        elif rid.startswith("gr"):
            assert text in ("yes!", "no!"), (rid, text)
        else:
            validate(json.loads(text), SCHEMA)


def test_json_object_and_any_whitespace_parse(engine):
    reqs = {f"j{i}": (prompt(13, 70 + i), params(GuideSpec("json_object"), 60, temperature=1.0, seed=i))
            for i in range(3)}
    for rid, r in run(engine, reqs).items():
        if r["reason"] == "stop":
            assert isinstance(json.loads(r["text"]), dict), r["text"]
        else:  # random weights may ramble past max_tokens: the prefix must still be valid so far
            assert r["reason"] == "length" and r["text"].lstrip().startswith("{"), r["text"]


def test_finished_guide_stops_without_eos_and_respects_ignore_eos(engine):
    """A complete guide ends the request at once ("stop", no EOS token); ignore_eos does not make a
    finished guide go on; with stop ids the guide decides when they may appear."""
    r = run(engine, {"a": (prompt(10, 3), params(GuideSpec("choice", json.dumps(["abc"])), ignore_eos=True))})["a"]
    assert r["reason"] == "stop" and r["text"] == "abc" and 2 not in r["tokens"]
    # [0-9]+ can always go on: ending needs an EOS the guide allows; it appears, if at all, only
    # after a digit, and never with ignore_eos
    for kw in (dict(eos_token_ids=[5]), dict(ignore_eos=True)):
        res = run(engine, {f"d{s}": (prompt(10, s), params(GuideSpec("regex", "[0-9]+"), 12, temperature=1.0, seed=s,
                                                             **kw)) for s in range(4)})
        for rid, r in res.items():
            toks = r["tokens"]
            assert re.fullmatch("[0-9]+", r["text"]), r["text"]
            if kw.get("ignore_eos"):
                assert r["reason"] == "length" and 5 not in toks and 2 not in toks
            else:
                assert 5 not in toks[:1] and 2 not in toks
                assert r["reason"] == ("stop" if toks[-1] == 5 else "length")


def test_min_tokens_does_not_break_a_guide(engine):
    """min_tokens masks EOS; when the guide then allows nothing else, the guide wins."""
    r = run(engine, {"m": (prompt(10, 5), params(GuideSpec("regex", "[0-9]{1,3}"), 10, min_tokens=8))})["m"]
    assert r["reason"] == "stop" and re.fullmatch("[0-9]{1,3}", r["text"]), r


def test_bad_guide_is_rejected_at_add_request(engine):
    for spec in (GuideSpec("regex", "((", field="x.regex"), GuideSpec("json_schema", "{", field="x.json"),
                 GuideSpec("grammar", "root ::= ((", field="x.grammar")):
        with pytest.raises(InvalidRequestError) as e:
            engine.add_request("bad", prompt(5), params(spec))
        assert e.value.field == spec.field
    assert not engine.requests and not engine.scheduler.waiting


def test_ids_beyond_the_tokenizer_are_never_chosen(tiny_model_dir, tmp_path):
    """config.json vocab_size larger than the tokenizer's: the extra rows of lm_head are made to
    win every unguided argmax; guided requests never choose them."""
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "padded"
    shutil.copytree(tiny_model_dir, d)
    w = load_file(str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    extra = 64
    emb, head = w["model.embed_tokens.weight"], w["lm_head.weight"]
    w["model.embed_tokens.weight"] = np.concatenate([emb, emb[:extra]])
    # extra row j = 50 x row j: 50 x the largest of 64 logits beats every real token's logit
    w["lm_head.weight"] = np.concatenate([head, 50.0 * head[:extra]])
    save_file(w, str(d / "model.safetensors"))
    cfg["vocab_size"] = cfg["vocab_size"] + extra
    (d / "config.json").write_text(json.dumps(cfg))
    eng = make_engine(str(d))
    vocab = cfg["vocab_size"] - extra
    free = run(eng, {"f": (prompt(10, 1), params(None, 8, ignore_eos=True))})["f"]["tokens"]
    assert any(t >= vocab for t in free), free  # the setup works: unguided picks the padded ids
    res = run(eng, {f"g{s}": (prompt(10, s), params(GuideSpec("regex", "[a-z ]{1,30}"), 12, temperature=1.0, seed=s))
                    for s in range(3)})
    for r in res.values():
        assert all(t < vocab for t in r["tokens"]), r["tokens"]
        assert re.fullmatch("[a-z ]{1,30}", r["text"]), r["text"]


def test_unguided_requests_never_build_the_llguidance_tokenizer(tiny_model_dir):
    eng = make_engine(tiny_model_dir)
    run(eng, {"u": (prompt(8), params(None, 4))})
    assert eng.guided._tokenizer is None and eng.guided._executor is None


def test_guided_decoding_close_stops_its_mask_thread():
    g = GuidedDecoding("unused", vocab_size=8, eos_token_ids=[0])
    ident = g.submit(threading.get_ident).result(timeout=10)
    worker = next(t for t in threading.enumerate() if t.ident == ident)
    assert worker.name.startswith("llm-guided-mask")
    g.close()
    g.close()  # idempotent
    worker.join(timeout=10)
    assert not worker.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        g.submit(lambda: 0)
