"""The configuration reference (docs/reference/configuration.md) is generated from the code that reads
the settings (docs/gen_config_reference.py), so a setting is documented once, in its class's docstring.
These tests fail when a parameter config_params accepts has no docstring entry, when an entry names
no parameter, when a variable `make serve` reads is missing from the page, or when the checked-in
page is stale (run `.venv/bin/python docs/gen_config_reference.py`, or `make docs`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gen_config_reference", REPO / "docs" / "gen_config_reference.py")
gen = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gen  # its dataclasses look their module up
spec.loader.exec_module(gen)

# environment plumbing the launcher passes to the stub processes, not settings of `make serve`
NOT_SETTINGS = {"PATH", "LD_LIBRARY_PATH"}
ENV_READERS = [REPO / "scripts" / "serve.sh", REPO / "scripts" / "launch_triton.py",
               *sorted((REPO / "backend" / "paddle_llm_launcher").glob("*.py")),
               REPO / "backend" / "paddle_llm_openai" / "cli.py"]


def accepted_parameters() -> set[str]:
    from paddle_llm_engine.config import DEPRECATED_ALIASES
    from paddle_llm_triton.config_params import SERVING_KEYS, engine_fields
    return set(engine_fields()) | SERVING_KEYS | set(DEPRECATED_ALIASES)


def test_every_accepted_parameter_is_on_the_page_with_its_documentation():
    params = {p.name: p for p in gen.parameters()}
    assert set(params) == accepted_parameters(), "the generator reads the same parameters config_params accepts"
    undocumented = sorted(n for n, p in params.items() if not (p.doc or "").strip())
    assert not undocumented, (f"parameters without a docstring entry (EngineConfig in paddle_llm_engine/config.py, "
                              f"ServingOptions in paddle_llm_triton/config_params.py): {undocumented}")


def test_no_docstring_entry_names_a_parameter_that_does_not_exist():
    stale = sorted(gen.documented_names() - accepted_parameters())
    assert not stale, f"docstring entries for parameters config_params does not accept: {stale}"


def test_defaults_on_the_page_are_the_dataclasses_defaults():
    from paddle_llm_engine.config import EngineConfig
    from paddle_llm_triton.config_params import ServingOptions
    params = {p.name: p for p in gen.parameters()}
    for cls in (EngineConfig, ServingOptions):
        for f in dataclasses.fields(cls):
            value = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            assert params[f.name].default == gen._default_text(value), f.name


def test_shipped_config_sets_only_accepted_parameters():
    shipped = gen.shipped_parameters()
    assert "max_num_seqs" in shipped and "model_dir" in shipped, "the config.pbtxt parser finds the parameters"
    assert set(shipped) <= accepted_parameters()


def test_every_variable_make_serve_reads_is_on_the_page():
    page = gen.PAGE.read_text()
    text = "\n".join(p.read_text() for p in ENV_READERS)
    read = set(re.findall(r'(?:environ|env)\.get\("([A-Z][A-Z0-9_]+)"', text))
    read |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]+):-", text))
    read |= set(re.findall(r'^[A-Z_]*ENV = "([A-Z][A-Z0-9_]+)"', text, re.M))
    assert {"BIND_ADDRESS", "DRAIN_ACCEPT_S", "VLLM_API_KEY", "MODEL_DIR"} <= read, "the readers are found"
    missing = sorted(n for n in read - NOT_SETTINGS if n not in page)
    assert not missing, f"environment variables read by make serve's scripts but not documented: {missing}"


def test_the_page_is_up_to_date():
    assert gen.PAGE.read_text() == gen.render(), \
        "docs/reference/configuration.md is stale: run .venv/bin/python docs/gen_config_reference.py"


def test_docstring_entries_parser():
    doc = '''Summary line.

    alpha: first line
        continued here.
    beta / gamma: shared text.
    not an entry because
        this is prose.
    '''
    entries = gen.docstring_entries(doc)
    assert entries == {"alpha": "first line continued here.", "beta": "shared text.", "gamma": "shared text."}


def test_the_shipped_config_lists_every_parameter_set_or_commented_out_at_its_default():
    """A user reads every setting in the one file they would edit: each accepted parameter (but the
    deprecated aliases and the test-only fault injection) is set in config.pbtxt or listed on a
    commented-out line whose value is the documented default."""
    from paddle_llm_engine.config import DEPRECATED_ALIASES

    text = gen.PBTXT.read_text()
    listed = dict(re.findall(r'^#\s*parameters\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"',
                             text, re.M))
    shipped = gen.shipped_parameters()
    assert not set(listed) & set(shipped), "a parameter both set and listed"
    missing = accepted_parameters() - set(listed) - set(shipped) - set(DEPRECATED_ALIASES) - {"fault_inject_after_steps"}
    assert not missing, f"not in model_repository/llm/config.pbtxt: {sorted(missing)}"
    defaults = {p.name: p.default.strip('"') for p in gen.parameters()}
    wrong = {k: (v, defaults[k]) for k, v in listed.items() if v != defaults[k] and not (k == "device_id" and v == "")}
    assert not wrong, f"listed value is not the default (listed, default): {wrong}"
