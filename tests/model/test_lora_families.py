"""Multi-LoRA against HF PEFT (torch CPU, fp32), on the tiny random checkpoint of every family.

Per family, three random adapters in PEFT's format (tests/support/lora_adapters.make_adapter, numpy):
"attn" (q/k/v/o, r 8), "all" (q/k/v/o/gate/up/down, r 8; MLP only on dense layers of the MoE
families) and "rslora" (q/v/o/up/down, r 16, rsLoRA scale, rank_pattern / alpha_pattern: v_proj r 4,
layer 1's q_proj r 12, down_proj alpha 24). The fixtures lora_<family>.npz / .json come from
tests/reference/make_lora_references.py in the reference venv (peft.PeftModel.from_pretrained on the
HF model): 16 greedy tokens per adapter and prompt and the logits rows behind output positions
0, 1, 2, 5, 10, 15. The adapters are regenerated here and their sha256 must equal the fixture's.

Checked:
- test_every_adapter_against_peft: one engine per family, the 4 prompts x (base, attn, all, rslora)
  all added before the first step, which runs all 16 (3 adapters and the base in one step); then
  every decode step mixes them too. Every greedy token equals PEFT's (base rows: HF's, the fixture of
  test_model_families.py) and every logits row is within LOGIT_ATOL of it (the bound of
  test_model_families.py);
- test_mixed_step_gives_what_each_request_gets_alone: the same requests one at a time on that engine
  (prefix cache off): the same tokens, logits within ALONE_ATOL;
- test_one_lora_slot_serves_every_adapter_in_turn: max_loras 1 with the 16 requests queued at once:
  no step holds two adapters, requests of the others wait (lora_waiting) and every request still
  gets its own answer;
- test_add_and_remove_lora_at_runtime: an adapter loaded after start (add_lora) answers as PEFT; unloaded
  while its request runs (remove_lora), the request finishes with its answer and a new request
  naming it is refused (field lora_name); the name loaded again from another folder is a new
  adapter (its answer is the other folder's);
- test_prefix_cache_is_kept_apart_per_adapter: prefix caching on, the same prompt with the base, two
  adapters, then again: the first run of each finds nothing cached (the others' blocks are
  different K/V), the repeats find their own blocks, and all answers are PEFT's;
- test_tensor_parallel_2_equals_1: TP = 2 (gloo, two ranks) gives TP = 1's tokens, logits within
  TP_ATOL (the bound of test_tensor_parallel.py), on llama_untied (q/k/v/o/MLP biases);
- test_standin_gcu_equals_cpu: the engine on the stand-in GCU plug-in (tests/gcu_standin: NOT an
  Enflame GCU, its reference kernels on host memory) gives CPU's tokens and logits within GCU_ATOL,
  on ernie4_5 (interleaved rotary: the adapter's q/k rows permuted as the base's).

Measured on the 2-core dev host (paddle 3.3.1 CPU vs torch 2.13.0 + transformers 5.24.0 + peft
0.21.2; printed per family with pytest -s), max |logits - PEFT's| base / attn / all / rslora:
  llama_tied 9.3e-5 / 8.3e-5 / 9.1e-5 / 7.6e-5, llama_untied 2.7e-5 / 2.3e-5 / 2.5e-5 / 2.4e-5,
  qwen2 4.4e-5 / 3.3e-5 / 3.3e-5 / 4.2e-5, qwen2_yarn 5.5e-5 / 5.0e-5 / 4.0e-5 / 4.0e-5,
  qwen3 7.2e-5 / 5.3e-5 / 6.1e-5 / 4.5e-5, ernie4_5 4.6e-5 / 3.9e-5 / 8.8e-5 / 7.1e-5,
  qwen3_moe 2.3e-4 / 2.0e-4 / 1.7e-4 / 1.4e-4, qwen2_moe 8.7e-5 / 6.9e-5 / 4.3e-5 / 6.2e-5,
  ernie4_5_moe 1.6e-4 / 1.5e-4 / 2.1e-4 / 2.3e-4, ernie4_5_moe_interval 2.0e-4 / 1.5e-4 / 1.3e-4 / 1.3e-4:
the adapters' rows as close as the base model's. The adapters move the first logits row by 1.4-15
and change the tokens of 1-4 of the 4 prompts each (fixtures' JSON); a scale off by 1% moves the
logits by 1e-2 or more in every family (tried), far outside LOGIT_ATOL. The smallest top-1/top-2 gap
of PEFT's rows is 0.0017 (qwen3), 20x the largest difference there. About 13 s for the whole file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from paddle_llm_engine import LLMEngine, SamplingParams
from paddle_llm_engine.lora import LoraError

import lora_adapters as la
import tiny_checkpoints as tc
from test_model_families import LOGIT_ATOL, REF_DIR, load_fixture, make_engine

# Batch composition: rows in another step shape (decode stack vs per-layer ops, MoE expert groups) sum
# in another order; measured at most 8.7e-5 dense, 1.9e-4 MoE (qwen3_moe); a delta applied to the wrong
# rows moves logits by O(1)
ALONE_ATOL = 5e-4
TP_ATOL = 1e-4  # test_tensor_parallel.py's bound; measured 2.3e-5
GCU_ATOL = 3e-4  # the stand-in's reference kernels vs the C++ CPU kernels; measured 6.2e-5
N_NEW = tc.NUM_NEW_TOKENS
TP_FAMILY = "llama_untied"
GCU_FAMILY = "ernie4_5"
REGEN = "regenerate the fixtures: <ref-venv>/bin/python tests/reference/make_lora_references.py"


def greedy(lora_name: str | None = None, n: int = N_NEW) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n, lora_name=lora_name)


@dataclass
class Family:
    """A family's checkpoint and adapters (regenerated, checked against the fixture) and references."""

    name: str
    model_dir: str
    adapters: dict[str, str]  # adapter name -> folder, in the fixture's order
    ref: dict                 # lora_<family>.npz arrays + "meta"
    base: dict                # tiny_<family>.npz (test_model_families.load_fixture)

    @property
    def lora_modules(self) -> str:
        return ",".join(f"{n}={p}" for n, p in self.adapters.items())

    def want(self, adapter: str | None, i: int) -> tuple[list[int], np.ndarray, list[int]]:
        """(PEFT's / HF's tokens, its logits rows, which output positions those rows are)."""
        if adapter is None:
            return self.base["output_ids"][i].tolist(), self.base["logits"][i], list(range(N_NEW))
        a = list(self.adapters).index(adapter)
        return self.ref["output_ids"][a, i].tolist(), self.ref["logits"][a, i], self.ref["logit_steps"].tolist()

    def check(self, adapter: str | None, i: int, tokens: list[int], rows: list, what: str = "") -> float:
        """Assert the tokens equal the reference's and the logits rows are within LOGIT_ATOL; the max diff."""
        want_tokens, want_rows, steps = self.want(adapter, i)
        label = f"{self.name} {adapter or 'base'} prompt {i}{what}"
        assert tokens == want_tokens, f"{label}: greedy tokens differ from PEFT's:\n got {tokens}\nwant {want_tokens}"
        diff = float(np.abs(np.stack(rows)[steps] - want_rows).max())
        assert diff < LOGIT_ATOL, f"{label}: logits max abs diff {diff:.2e} from PEFT's"
        return diff


def load_lora_fixture(family: str) -> dict:
    path = REF_DIR / "fixtures" / f"lora_{family}.npz"
    if not path.is_file():
        pytest.fail(f"{path} missing: {REGEN}", pytrace=False)
    d = dict(np.load(path))
    d["meta"] = json.loads(path.with_suffix(".json").read_text())
    return d


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """name -> Family, made once per module on first use."""
    made: dict[str, Family] = {}

    def get(name: str) -> Family:
        if name not in made:
            ref = load_lora_fixture(name)
            base = load_fixture(name)
            root = tmp_path_factory.mktemp(f"lora_{name}")
            model_dir = tc.make_checkpoint(name, root / "model")
            assert tc.tensors_sha256(model_dir) == ref["meta"]["tensors_sha256"], (
                f"{name}: tiny_checkpoints.py now makes other weights than the fixture's; {REGEN}")
            adapters = {}
            for spec in ref["meta"]["adapters"]:
                path = la.make_adapter(model_dir, root / spec["name"], **spec["make_adapter"])
                assert la.adapter_sha256(path) == spec["sha256"], (
                    f"{name}: lora_adapters.py now makes another {spec['name']!r} adapter than the fixture's; {REGEN}")
                adapters[spec["name"]] = str(path)
            made[name] = Family(name, str(model_dir), adapters, ref, base)
        return made[name]

    return get


def lora_engine(fam: Family, **kw) -> LLMEngine:
    cfg = dict(num_kv_blocks=64, max_num_seqs=16, max_num_batched_tokens=512, enable_lora=1,
               lora_modules=fam.lora_modules, max_loras=3)
    cfg.update(kw)
    return make_engine(fam.model_dir, **cfg)


def all_requests(fam: Family) -> list[tuple[str, str | None, int]]:
    """(request id, adapter, prompt index) of the 4 prompts with the base and every adapter."""
    return [(f"{a or 'base'}/p{i}", a, i) for a in (None, *fam.adapters) for i in range(len(tc.PROMPT_LENGTHS))]


def run(engine: LLMEngine, requests, first_step: set | None = None, probe=None) -> tuple[dict, dict, list[set]]:
    """Add the requests, step until done; (tokens, logits rows, per step {adapter names of its outputs}).
    first_step: filled with the request ids of the first step's outputs; probe(engine): called after
    every step."""
    prompts = tc.prompts()
    for rid, a, i in requests:
        engine.add_request(rid, prompts[i], greedy(a))
    tokens, rows, step_adapters = {}, {}, []
    lora_of = {rid: a for rid, a, _ in requests}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        outs = engine.step(return_logits=True)
        if first_step is not None and not step_adapters:
            first_step.update(o.request_id for o in outs)
        step_adapters.append({lora_of[o.request_id] for o in outs} - {None})
        if probe is not None:
            probe(engine)
        for o in outs:
            assert o.error is None, f"{o.request_id}: {o.error}"
            tokens.setdefault(o.request_id, []).extend(o.token_ids)
            rows.setdefault(o.request_id, []).append(o.logits)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "KV blocks leaked"
    return tokens, rows, step_adapters


@pytest.fixture(scope="module")
def runs(families):
    """name -> {"mixed": (tokens, rows), "alone": (tokens, rows)} of the family's engine, run once."""
    done: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in done:
            fam = families(name)
            engine = lora_engine(fam, enable_prefix_caching=0)
            try:
                reqs = all_requests(fam)
                first: set = set()
                tokens, rows, _ = run(engine, reqs, first)
                assert first == {rid for rid, _, _ in reqs}, "the first step did not run all 16 requests"
                alone_t, alone_r = {}, {}
                for req in reqs:
                    t, r, _ = run(engine, [req])
                    alone_t.update(t)
                    alone_r.update(r)
            finally:
                engine.close()
            done[name] = {"mixed": (tokens, rows), "alone": (alone_t, alone_r)}
        return done[name]

    return get


@pytest.mark.parametrize("name", sorted(tc.FAMILIES))
def test_every_adapter_against_peft(families, runs, name):
    fam = families(name)
    tokens, rows = runs(name)["mixed"]
    worst = {}
    for rid, a, i in all_requests(fam):
        d = fam.check(a, i, tokens[rid], rows[rid], " (one step with 3 adapters and the base)")
        worst[a or "base"] = max(worst.get(a or "base", 0.0), d)
    print(f"{name}: max |logits - PEFT's| " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))


@pytest.mark.parametrize("name", sorted(tc.FAMILIES))
def test_mixed_step_gives_what_each_request_gets_alone(families, runs, name):
    fam = families(name)
    (mixed_t, mixed_r), (alone_t, alone_r) = runs(name)["mixed"], runs(name)["alone"]
    worst = 0.0
    for rid, _, _ in all_requests(fam):
        assert alone_t[rid] == mixed_t[rid], f"{name} {rid}: tokens alone differ from those in the mixed steps"
        diff = float(np.abs(np.stack(alone_r[rid]) - np.stack(mixed_r[rid])).max())
        assert diff <= ALONE_ATOL, f"{name} {rid}: logits alone vs mixed differ by {diff:.2e}"
        worst = max(worst, diff)
    print(f"{name}: max |logits alone - mixed| {worst:.1e}")


def test_one_lora_slot_serves_every_adapter_in_turn(families):
    fam = families("qwen2")
    engine = lora_engine(fam, max_loras=1)
    stats = []
    try:
        reqs = all_requests(fam)
        tokens, rows, step_adapters = run(engine, reqs, probe=lambda e: stats.append(e.stats()))
        assert stats[0].max_loras == 1 and len(stats[0].lora_running) == 1, stats[0]
        assert len(stats[0].lora_waiting) == 2, stats[0]  # queued, not refused
        assert all(len(s) <= 1 for s in step_adapters), "a step used two adapters with max_loras 1"
        order = [next(iter(s)) for s in step_adapters if s]
        assert sorted(set(order)) == sorted(fam.adapters)
        assert engine.executor.worker.lora.num_reads >= len(fam.adapters)
    finally:
        engine.close()
    for rid, a, i in reqs:
        fam.check(a, i, tokens[rid], rows[rid], " (max_loras 1)")


def test_add_and_remove_lora_at_runtime(families):
    fam = families("llama_tied")
    engine = lora_engine(fam, lora_modules="", max_loras=2)
    prompts = tc.prompts()
    try:
        assert engine.list_loras() == []
        with pytest.raises(LoraError) as e:
            engine.add_request("early", prompts[0], greedy("late"))
        assert e.value.field == "lora_name" and "'late'" in str(e.value)
        first = engine.add_lora("late", fam.adapters["all"])
        assert [a.name for a in engine.list_loras()] == ["late"]
        engine.add_request("late/p3", prompts[3], greedy("late"))
        engine.add_request("base/p3", prompts[3], greedy())
        tokens, rows = {}, {}

        def step():
            for o in engine.step(return_logits=True):
                assert o.error is None, o.error
                tokens.setdefault(o.request_id, []).extend(o.token_ids)
                rows.setdefault(o.request_id, []).append(o.logits)

        for _ in range(4):
            step()
        removed = engine.remove_lora("late")
        assert removed.lora_id == first.lora_id and engine.list_loras() == []
        with pytest.raises(LoraError) as e:
            engine.add_request("late-again/p0", prompts[0], greedy("late"))
        assert e.value.field == "lora_name" and "'late'" in str(e.value)
        with pytest.raises(LoraError) as e:
            engine.remove_lora("late")
        assert e.value.field == "lora_name"
        while engine.has_unfinished_requests():  # the running request finishes on the unloaded adapter
            step()
        fam.check("all", 3, tokens["late/p3"], rows["late/p3"], " (loaded at run time, unloaded while running)")
        fam.check(None, 3, tokens["base/p3"], rows["base/p3"])
        # the name again, from another folder: a new adapter, not the old one's slot or host copy
        second = engine.add_lora("late", fam.adapters["attn"])
        assert second.lora_id != first.lora_id
        t, r, _ = run(engine, [("late2/p3", "late", 3)])
        fam.check("attn", 3, t["late2/p3"], r["late2/p3"], " (name loaded again from another folder)")
    finally:
        engine.close()


def test_prefix_cache_is_kept_apart_per_adapter(families):
    fam = families("qwen3")
    # a prompt of at least 2 full blocks whose answers differ between the base and both adapters
    i = next(i for i in (3, 2) if len({tuple(fam.want(a, i)[0]) for a in (None, "attn", "all")}) == 3)
    cached_blocks = (tc.PROMPT_LENGTHS[i] - 1) // 16 * 16
    engine = lora_engine(fam, enable_prefix_caching=1)
    try:
        cached, answers = {}, {}
        for n, a in enumerate((None, "attn", "all", "attn", None, "all")):
            rid = f"{n}:{a or 'base'}"
            engine.add_request(rid, tc.prompts()[i], greedy(a))
            t, rows = [], []
            while engine.has_unfinished_requests():
                for o in engine.step(return_logits=True):
                    t += o.token_ids
                    rows.append(o.logits)
                    cached[rid] = o.num_cached_tokens
            fam.check(a, i, t, rows, f" (run {n} on the prefix cache)")
            answers[a] = t
    finally:
        engine.close()
    assert cached == {"0:base": 0, "1:attn": 0, "2:all": 0, "3:attn": cached_blocks, "4:base": cached_blocks,
                      "5:all": cached_blocks}
    assert len({tuple(t) for t in answers.values()}) == 3


def test_tensor_parallel_2_equals_1(families, runs):
    fam = families(TP_FAMILY)
    tokens1, rows1 = runs(TP_FAMILY)["mixed"]
    engine = lora_engine(fam, tensor_parallel_size=2, num_threads=1, enable_prefix_caching=0)
    try:
        tokens2, rows2, _ = run(engine, all_requests(fam))
    finally:
        engine.close()
    worst = 0.0
    for rid, a, i in all_requests(fam):
        assert tokens2[rid] == tokens1[rid], f"{rid}: TP=2 tokens differ from TP=1's"
        diff = float(np.abs(np.stack(rows2[rid]) - np.stack(rows1[rid])).max())
        assert diff <= TP_ATOL, f"{rid}: max |logits TP=2 - TP=1| = {diff:.2e}"
        worst = max(worst, diff)
        fam.check(a, i, tokens2[rid], rows2[rid], " (TP=2)")
    print(f"TP2-vs-TP1 {TP_FAMILY} with LoRA: max |diff| {worst:.1e}")


def test_standin_gcu_equals_cpu(families, runs, tmp_path):
    from gcu_helpers import engine_kwargs, run_child, standin_build

    fam = families(GCU_FAMILY)
    tokens1, rows1 = runs(GCU_FAMILY)["mixed"]
    try:
        plugin = standin_build.build_plugin()
    except standin_build.PluginBuildError as e:
        pytest.fail(str(e), pytrace=False)
    package = standin_build.write_standin_package(tmp_path / "standin_pkg", None)
    reqs = all_requests(fam)
    spec = {"action": "generate", "prompts": [tc.prompts()[i] for _, _, i in reqs], "max_tokens": N_NEW,
            "lora_names": [a for _, a, _ in reqs], "logits": True,
            "engine": engine_kwargs(fam.model_dir, device="auto", max_num_seqs=16, enable_lora=1,
                                    lora_modules=fam.lora_modules, max_loras=3, enable_prefix_caching=0)}
    g = run_child(spec, plugin, package).ok()
    assert g["device"] == "gcu:0" and g["platform_class"] == "GcuPlatform"
    worst = 0.0
    for (rid, a, i), t, r in zip(reqs, g["tokens"], g["logits"]):
        assert t == tokens1[rid], f"{rid}: stand-in GCU tokens differ from CPU's"
        diff = float(np.abs(np.asarray(r, np.float32) - np.stack(rows1[rid])).max())
        assert diff <= GCU_ATOL, f"{rid}: max |logits GCU - CPU| = {diff:.2e}"
        worst = max(worst, diff)
        fam.check(a, i, t, r, " (stand-in GCU)")
    print(f"stand-in GCU vs CPU {GCU_FAMILY} with LoRA: max |diff| {worst:.1e}")
