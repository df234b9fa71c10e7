"""LoRA serving in the `llm` model's adapter (paddle_llm_triton), on real engines of the tiny random
Llama (tests/support/tiny_model.py) with adapters made by tests/support/lora_adapters.py:

- `lora_name` in sampling_parameters (tensor and request parameters) reaches SamplingParams; the
  engine's refusal of an unknown adapter comes back naming sampling_parameters.lora_name and the
  adapter;
- multi_lora.json beside the model (the vLLM backend's file): relative paths from its folder, merged
  with lora_modules, a bad file or a name in both refused naming the file, a bad adapter stopping the
  start naming the adapter, the field and the file; ignored with enable_lora 0;
- the runtime settings (allow_runtime_lora_updating, lora_root, the admin key) refused naming what is
  missing;
- runtime loads and unloads (llm/lora_admin.py) between two instances, each with its own engine and
  its own control bus (real abstract sockets): applied on both, vLLM's texts for the refusals,
  lora_root enforced through symbolic links, the key required, a sibling's failure or silence rolled
  back everywhere, load_inplace, and the adapter's tokens on the sibling equal to the origin's.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest

from lora_adapters import make_adapter
from paddle_llm_engine import EngineConfig, LLMEngine, SamplingParams
from paddle_llm_triton.config_params import LORA_ADMIN_KEY_ENV, ServingOptions, serving_options
from paddle_llm_triton.contracts.vllm import contract_error, from_request_parameters, from_vllm_json
from paddle_llm_triton.engine_channel.control_bus import ControlBus, ask
from paddle_llm_triton.llm.lora_admin import BUS_TYPE, LoraAdmin, LoraAdminError
from paddle_llm_triton.llm.lora_start import (RuntimeLoraSettings, add_start_adapters, explain_start_error,
                                              read_multi_lora, runtime_settings)

KEY = "k" * 24
VOCAB = 49152


def engine(model_dir: str, **kw) -> LLMEngine:
    cfg = dict(model_dir=model_dir, device="cpu", block_size=16, num_kv_blocks=64, max_model_len=128,
               max_num_seqs=4, max_num_batched_tokens=256, num_threads=1, enable_lora=1)
    cfg.update(kw)
    return LLMEngine(EngineConfig(**cfg))


def greedy_tokens(eng: LLMEngine, lora: str | None, n: int = 8) -> list[int]:
    rid = uuid.uuid4().hex
    eng.add_request(rid, [5, 17, 300, 4000, 12], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                                                                lora_name=lora))
    out = []
    while eng.has_unfinished_requests():
        for o in eng.step():
            out += o.token_ids
    return out


# -- the contract ---------------------------------------------------------------------------------------

def test_lora_name_from_the_tensor_and_from_request_parameters():
    assert from_vllm_json('{"lora_name": "sql", "temperature": "0"}', VOCAB).lora_name == "sql"
    p, _ = from_request_parameters('{"lora_name": "sql"}', VOCAB)
    assert p.lora_name == "sql"
    assert from_vllm_json('{"lora_name": null}', VOCAB).lora_name is None
    with pytest.raises(Exception) as e:
        from_vllm_json('{"lora_name": 3}', VOCAB)
    assert str(e.value).startswith("sampling_parameters.lora_name: ")
    with pytest.raises(Exception) as e:
        from_vllm_json('{"lora_name": ""}', VOCAB)
    assert str(e.value).startswith("sampling_parameters.lora_name: ")


def test_an_unknown_adapter_is_refused_naming_lora_name_and_the_adapter(tiny_model_dir):
    for eng in (engine(tiny_model_dir), engine(tiny_model_dir, enable_lora=0)):
        try:
            with pytest.raises(Exception) as e:
                eng.check_request([5, 6, 7], from_vllm_json('{"lora_name": "nope"}', VOCAB))
            err = contract_error(e.value)
            assert err.field == "sampling_parameters.lora_name" and "'nope'" in str(err), str(err)
        finally:
            eng.close()


# -- adapters at start ----------------------------------------------------------------------------------

def _args(repo, version="1") -> dict:
    return {"model_repository": str(repo), "model_version": version}


def test_multi_lora_json_relative_paths_and_merge_with_lora_modules(tiny_model_dir, tmp_path):
    (tmp_path / "llm" / "1").mkdir(parents=True)
    a = make_adapter(tiny_model_dir, tmp_path / "adapters" / "a", seed=1)
    b = make_adapter(tiny_model_dir, tmp_path / "adapters" / "b", seed=2)
    (tmp_path / "llm" / "1" / "multi_lora.json").write_text(json.dumps({"a": "../../adapters/a", "b": str(b)}))
    cfg = EngineConfig(model_dir=tiny_model_dir, enable_lora=1, lora_modules=f"b={b}")
    from_file = add_start_adapters(cfg, _args(tmp_path / "llm"))
    assert set(from_file) == {"a", "b"}
    entries = dict(cfg.lora_module_entries())
    assert list(entries) == ["b", "a"] and os.path.realpath(entries["a"]) == str(a.resolve())
    eng = engine(tiny_model_dir, lora_modules=cfg.lora_modules, max_loras=2)
    try:
        assert [x.name for x in eng.list_loras()] == ["b", "a"]
        base, with_a = greedy_tokens(eng, None), greedy_tokens(eng, "a")
        assert len(with_a) == 8 and with_a != base
    finally:
        eng.close()


def test_multi_lora_json_refusals_name_the_file(tiny_model_dir, tmp_path):
    f = tmp_path / "llm" / "1" / "multi_lora.json"
    f.parent.mkdir(parents=True)
    for text in ("[1, 2]", "{\"a\": 3}", "not json", "{\"a\": \"\"}"):
        f.write_text(text)
        with pytest.raises(ValueError, match="multi_lora.json"):
            read_multi_lora(f)
    a = make_adapter(tiny_model_dir, tmp_path / "a", seed=1)
    b = make_adapter(tiny_model_dir, tmp_path / "b", seed=2)
    f.write_text(json.dumps({"x": str(a)}))
    with pytest.raises(ValueError, match=r"'x' is in both lora_modules .* and .*multi_lora.json"):
        add_start_adapters(EngineConfig(model_dir=tiny_model_dir, enable_lora=1, lora_modules=f"x={b}"),
                           _args(tmp_path / "llm"))
    cfg = EngineConfig(model_dir=tiny_model_dir, enable_lora=0)
    assert add_start_adapters(cfg, _args(tmp_path / "llm")) == {} and cfg.lora_modules == ""  # ignored


def test_a_bad_adapter_of_multi_lora_json_stops_the_start_naming_adapter_field_and_file(tiny_model_dir, tmp_path):
    bad = make_adapter(tiny_model_dir, tmp_path / "bad", seed=1, r=32)  # above max_lora_rank 16
    f = tmp_path / "llm" / "1" / "multi_lora.json"
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"big": str(bad)}))
    cfg = EngineConfig(model_dir=tiny_model_dir, device="cpu", block_size=16, num_kv_blocks=64, max_model_len=128,
                       num_threads=1, enable_lora=1)
    from_file = add_start_adapters(cfg, _args(tmp_path / "llm"))
    with pytest.raises(ValueError) as e:
        LLMEngine(cfg)
    msg = str(explain_start_error(e.value, from_file))
    assert msg.startswith("r: ") and "'big'" in msg and "max_lora_rank" in msg and str(f) in msg, msg


def test_runtime_settings_name_what_is_missing(tiny_model_dir, tmp_path):
    def opts(**kw) -> ServingOptions:
        return ServingOptions(allow_runtime_lora_updating=True, **kw)

    on = EngineConfig(model_dir=tiny_model_dir, enable_lora=1)
    env = {LORA_ADMIN_KEY_ENV: KEY}
    assert runtime_settings(on, ServingOptions(), env) is None
    off = EngineConfig(model_dir=tiny_model_dir)
    for cfg, o, e, words in ((off, opts(lora_root=str(tmp_path)), env, "enable_lora"),
                             (on, opts(), env, "needs lora_root"),
                             (on, opts(lora_root="relative/dir"), env, "absolute"),
                             (on, opts(lora_root=str(tmp_path / "missing")), env, "absolute path of a folder"),
                             (on, opts(lora_root=str(tmp_path)), {}, LORA_ADMIN_KEY_ENV),
                             (on, opts(lora_root=str(tmp_path)), {LORA_ADMIN_KEY_ENV: "short"}, "16 characters")):
        with pytest.raises(ValueError, match=words):
            runtime_settings(cfg, o, e)
    s = runtime_settings(on, opts(lora_root=str(tmp_path)), env)
    assert s.root == os.path.realpath(tmp_path) and s.key == KEY and KEY not in repr(s)
    parsed = serving_options({"parameters": {"allow_runtime_lora_updating": {"string_value": "1"},
                                             "lora_root": {"string_value": f" {tmp_path} "}}})
    assert parsed.allow_runtime_lora_updating is True and parsed.lora_root == str(tmp_path)
    with pytest.raises(ValueError, match="allow_runtime_lora_updating"):
        serving_options({"parameters": {"allow_runtime_lora_updating": {"string_value": "maybe"}}})


# -- runtime loads across two instances -----------------------------------------------------------------

class Instance:
    """One llm instance's LoRA side: its engine, control bus and LoraAdmin."""

    def __init__(self, model_dir, name, peers, server_pid, settings, **engine_kw):
        self.engine = engine(model_dir, **engine_kw)
        self.bus = ControlBus("llm", name, {}, peers, server_pid=server_pid)
        self.admin = LoraAdmin(self.engine, settings, self.bus, timeout_s=2.0)
        self.bus.handlers[BUS_TYPE] = self.admin.on_bus

    def names(self) -> list[str]:
        return [a.name for a in self.engine.list_loras()]

    def close(self):
        self.bus.close()
        self.engine.close()


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("lora_root")
    make_adapter(tiny_model_dir, root / "a", seed=11, magnitude=3.0)
    make_adapter(tiny_model_dir, root / "b", seed=12, magnitude=3.0, targets=("q_proj", "v_proj"))
    make_adapter(tiny_model_dir, root / "wide", seed=13, r=16)
    outside = make_adapter(tiny_model_dir, tmp_path_factory.mktemp("outside") / "o", seed=14)
    os.symlink(outside, root / "link_out")
    return root


@pytest.fixture(scope="module")
def pair(tiny_model_dir, lora_root):
    """Two instances llm_0_0 / llm_0_1 of one fake server (a pid no real server has)."""
    pid = 4_000_000_000 + os.getpid()
    settings = RuntimeLoraSettings(os.path.realpath(lora_root), KEY)
    names = ["llm_0_0", "llm_0_1"]
    made = [Instance(tiny_model_dir, n, names, pid, settings) for n in names]
    yield made
    for inst in made:
        inst.close()


def call(inst: Instance, **req) -> dict:
    """One lora_admin request through handle() (its own thread, as from Triton)."""
    done, box = threading.Event(), {}

    def reply(result, error):
        box.update(result=result, error=error)
        done.set()

    inst.admin.handle(json.dumps(req), reply)
    assert done.wait(30), "no reply"
    if box["error"] is not None:
        raise box["error"]
    return box["result"]


def refused(inst: Instance, **req) -> LoraAdminError:
    with pytest.raises(LoraAdminError) as e:
        call(inst, **req)
    return e.value


def test_load_reaches_every_instance_and_serves_the_same_weights_there(pair):
    a, b = pair
    r = call(a, action="load", lora_name="sql", lora_path="a", key=KEY)
    assert r["message"] == "Success: LoRA adapter 'sql' added successfully."
    assert "sql" in a.names() and "sql" in b.names()
    assert [x["path"] for x in call(b, action="list")["adapters"] if x["name"] == "sql"] == ["a"]  # as given
    on_a, on_b = greedy_tokens(a.engine, "sql"), greedy_tokens(b.engine, "sql")
    assert on_a == on_b and on_a != greedy_tokens(b.engine, None)
    replies = ask(a.bus.server_pid, [("llm", "llm_0_1")], {"type": BUS_TYPE, "action": "list"}, 5)
    assert ("sql", "a") in [tuple(x) for x in replies[("llm", "llm_0_1")]["adapters"]]
    e = refused(b, action="load", lora_name="sql", lora_path="b", key=KEY)
    assert str(e) == ("lora_name: The lora adapter 'sql' has already been loaded. If you want to load the adapter "
                      "in place, set 'load_inplace' to True.")
    # load_inplace: new weights on both
    call(b, action="load", lora_name="sql", lora_path="b", load_inplace=True, key=KEY)
    assert greedy_tokens(a.engine, "sql") == greedy_tokens(b.engine, "sql") != on_a
    r = call(b, action="unload", lora_name="sql", key=KEY)
    assert r["message"] == "Success: LoRA adapter 'sql' removed successfully."
    assert "sql" not in a.names() + b.names()
    e = refused(a, action="unload", lora_name="sql", key=KEY)
    assert (str(e), e.kind) == ("lora_name: The lora adapter 'sql' cannot be found.", "not_found")


def test_refusals_name_the_field_with_vllms_texts(pair, lora_root):
    a, _ = pair
    cases = [({"lora_name": "x", "lora_path": "a"}, "denied", "PADDLE_LLM_LORA_ADMIN_KEY"),  # no key
             ({"lora_name": "x", "lora_path": "a", "key": KEY[:-1] + "j"}, "denied", "PADDLE_LLM_LORA_ADMIN_KEY"),
             ({"lora_name": "x", "lora_path": "missing", "key": KEY}, "not_found",
              "lora_path: Loading lora x failed: No adapter found for missing"),
             ({"lora_name": "x", "lora_path": "link_out", "key": KEY}, "invalid", "lora_path: 'link_out' resolves "
                                                                                  "outside lora_root"),
             ({"lora_name": "x", "lora_path": "../../etc", "key": KEY}, "invalid", "outside lora_root"),
             ({"lora_name": "", "lora_path": "a", "key": KEY}, "invalid", "must be provided"),
             ({"lora_name": "a,b", "lora_path": "a", "key": KEY}, "invalid", "lora_name: "),
             ({"lora_name": "trtllm-task-7", "lora_path": "a", "key": KEY}, "invalid", "TensorRT-LLM"),
             ({"lora_path": "a", "key": KEY}, "invalid", "Both 'lora_name' and 'lora_path' must be provided.")]
    for req, kind, words in cases:
        e = refused(a, action="load", **req)
        assert e.kind == kind and words in str(e), (req, str(e))
    assert "x" not in a.names()
    e = refused(a, action="unload", key=KEY)
    assert str(e) == "lora_name: 'lora_name' needs to be provided to unload a LoRA adapter."
    assert refused(a, action="drop", key=KEY).field == "lora_admin"
    done, box = threading.Event(), []
    a.admin.handle("[1]", lambda r, e: (box.append(e), done.set()))  # not an object: answered with an error
    assert done.wait(10) and box[0].field == "lora_admin" and "JSON object" in str(box[0])


def test_a_siblings_refusal_or_silence_rolls_back_everywhere(tiny_model_dir, lora_root):
    pid = 4_100_000_000 + os.getpid()
    settings = RuntimeLoraSettings(os.path.realpath(lora_root), KEY)
    names = ["llm_0_0", "llm_0_1"]
    a = Instance(tiny_model_dir, "llm_0_0", names, pid, settings)
    b = Instance(tiny_model_dir, "llm_0_1", names, pid, settings, max_lora_rank=8)  # refuses rank 16
    try:
        e = refused(a, action="load", lora_name="w", lora_path="wide", key=KEY)
        assert e.field == "r" and "llm_0_1" in str(e) and "nothing was changed" in str(e), str(e)
        assert "w" not in a.names() + b.names()
        call(a, action="load", lora_name="ok", lora_path="a", key=KEY)
        b.bus.close()  # the sibling stops answering
        e = refused(a, action="unload", lora_name="ok", key=KEY)
        assert e.kind == "failed" and "did not answer" in str(e), str(e)
        assert "ok" in a.names(), "the origin's unload was put back"
    finally:
        a.close()
        b.engine.close()


def test_without_runtime_updating_only_the_list_answers(tiny_model_dir, lora_root):
    pid = 4_200_000_000 + os.getpid()
    inst = Instance(tiny_model_dir, "llm_0_0", ["llm_0_0"], pid, None,
                    lora_modules=f"static={lora_root / 'a'}")
    try:
        assert [x["name"] for x in call(inst, action="list")["adapters"]] == ["static"]
        assert call(inst, action="list")["runtime_updating"] is False
        e = refused(inst, action="unload", lora_name="static", key=KEY)
        assert e.kind == "denied" and "allow_runtime_lora_updating" in str(e)
    finally:
        inst.close()
