"""config.pbtxt parameters -> EngineConfig (paddle_llm_triton/config_params.py) and instance -> device
mapping (paddle_llm_triton/lifecycle/instances.py): every EngineConfig field is a parameter, unknown names are
rejected by name, a non-empty model_dir wins over PADDLE_LLM_MODEL_DIR, and the instance ordinal
picks the device."""

from __future__ import annotations

import dataclasses

import pytest

from paddle_llm_engine.config import EngineConfig
from paddle_llm_triton.config_params import (MODEL_DIR_ENV, engine_config_from_triton, engine_fields,
                                             resolve_model_dir, serving_options)
from paddle_llm_triton.lifecycle.instances import instance_names, instance_ordinal


def model_config(params: dict | None = None, groups: list | None = None) -> dict:
    cfg = {"name": "llm", "parameters": {k: {"string_value": v} for k, v in (params or {}).items()}}
    if groups is not None:
        cfg["instance_group"] = groups
    return cfg


def args(instance: str = "llm_0_0", device_id: str = "0") -> dict:
    return {"model_name": "llm", "model_instance_name": instance, "model_instance_device_id": device_id,
            "model_instance_kind": "CPU"}


def _non_default(name: str, type_name: str, default):
    """A value != the field's default, as (config string, expected Python value)."""
    if name == "model_dir":
        return "/models/from-config", "/models/from-config"
    if name == "device":
        return "cpu", "cpu"
    if type_name == "int":
        v = (default or 0) + 3
        return str(v), v
    if type_name == "float":
        v = 0.25 if default != 0.25 else 0.5
        return repr(v), v
    if type_name == "bool":
        return ("false", False) if default else ("true", True)
    return "x" + str(default), "x" + str(default)


@pytest.fixture(autouse=True)
def _no_env_model_dir(monkeypatch):
    monkeypatch.delenv(MODEL_DIR_ENV, raising=False)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(EngineConfig)])
def test_every_engine_config_field_is_a_parameter(field):
    f = {x.name: x for x in dataclasses.fields(EngineConfig)}[field]
    default = f.default if f.default is not dataclasses.MISSING else None
    text, expected = _non_default(field, engine_fields()[field], default)
    params = {"model_dir": "/models/m"}
    params[field] = text
    cfg = engine_config_from_triton(model_config(params), args())
    assert getattr(cfg, field) == expected
    assert isinstance(cfg, EngineConfig)


def test_empty_parameter_means_the_default():
    defaults = EngineConfig(model_dir="/m")
    params = {f.name: "" for f in dataclasses.fields(EngineConfig)}
    params["model_dir"] = "/m"
    cfg = engine_config_from_triton(model_config(params), args())
    for f in dataclasses.fields(EngineConfig):
        assert getattr(cfg, f.name) == getattr(defaults, f.name), f.name


def test_unknown_parameter_is_rejected_by_name():
    with pytest.raises(ValueError) as e:
        engine_config_from_triton(model_config({"model_dir": "/m", "max_num_seq": "8", "bogus": "1"}), args())
    msg = str(e.value)
    assert "unknown parameters" in msg and "max_num_seq" in msg and "bogus" in msg
    assert "max_num_seqs" in msg  # the accepted names are listed


def test_malformed_value_names_the_parameter():
    with pytest.raises(ValueError, match="max_num_seqs must be an integer"):
        engine_config_from_triton(model_config({"model_dir": "/m", "max_num_seqs": "eight"}), args())


def test_non_empty_model_dir_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(MODEL_DIR_ENV, "/models/from-env")
    cfg = engine_config_from_triton(model_config({"model_dir": "/models/from-config"}), args())
    assert cfg.model_dir == "/models/from-config"
    assert resolve_model_dir(model_config({"model_dir": "/models/from-config"})) == "/models/from-config"


def test_empty_model_dir_falls_back_to_the_environment(monkeypatch):
    monkeypatch.setenv(MODEL_DIR_ENV, "/models/from-env")
    assert engine_config_from_triton(model_config({"model_dir": ""}), args()).model_dir == "/models/from-env"
    assert engine_config_from_triton(model_config({}), args()).model_dir == "/models/from-env"
    assert resolve_model_dir(model_config({"model_dir": ""})) == "/models/from-env"


def test_no_model_dir_anywhere_is_an_error():
    with pytest.raises(ValueError, match="model_dir is empty"):
        engine_config_from_triton(model_config({"model_dir": ""}), args())
    with pytest.raises(ValueError, match="model_dir is empty"):
        resolve_model_dir(model_config({}))


def test_environment_does_not_override_other_settings(monkeypatch):
    monkeypatch.setenv("MAX_NUM_SEQS", "3")
    monkeypatch.setenv("PADDLE_LLM_MAX_NUM_SEQS", "3")
    cfg = engine_config_from_triton(model_config({"model_dir": "/m", "max_num_seqs": "7"}), args())
    assert cfg.max_num_seqs == 7


# -- instances -> devices ----------------------------------------------------------------------------

def test_instance_names_and_ordinals():
    cfg = model_config({}, groups=[{"name": "llm_0", "kind": "KIND_CPU", "count": 2},
                                   {"name": "llm_1", "kind": "KIND_CPU", "count": 3}])
    assert instance_names(cfg, "llm") == ["llm_0_0", "llm_0_1", "llm_1_0", "llm_1_1", "llm_1_2"]
    assert instance_ordinal(cfg, "llm", "llm_0_1") == 1
    assert instance_ordinal(cfg, "llm", "llm_1_2") == 4
    # a config without instance_group (Triton fills it in; one instance by default)
    assert instance_names(model_config({}), "llm") == ["llm_0_0"]
    # unnamed groups are called <model>_<position> by Triton
    assert instance_names(model_config({}, groups=[{"count": 2}]), "m") == ["m_0_0", "m_0_1"]
    # a name the config does not list: its trailing index
    assert instance_ordinal(model_config({}), "llm", "custom_7") == 7


TWO_CPU = [{"name": "llm_0", "kind": "KIND_CPU", "count": 2}]


@pytest.mark.parametrize("instance,expected", [("llm_0_0", 4), ("llm_0_1", 6)])
def test_gcu_device_ids_select_by_instance_index(instance, expected):
    # Triton gives every KIND_CPU instance device id 0: the instance index must choose the id
    cfg = engine_config_from_triton(model_config({"model_dir": "/m", "gcu_device_ids": "4;6"}, TWO_CPU),
                                    args(instance, device_id="0"))
    assert cfg.device_id == expected


def test_more_instances_than_gcu_ids_wrap_around():
    groups = [{"name": "llm_0", "kind": "KIND_CPU", "count": 3}]
    ids = [engine_config_from_triton(model_config({"model_dir": "/m", "gcu_device_ids": "0;1"}, groups),
                                     args(f"llm_0_{i}")).device_id for i in range(3)]
    assert ids == [0, 1, 0]


def test_without_gcu_device_ids_instance_k_uses_device_k():
    ids = [engine_config_from_triton(model_config({"model_dir": "/m"}, TWO_CPU), args(f"llm_0_{i}")).device_id
           for i in range(2)]
    assert ids == [0, 1]


def test_explicit_device_id_pins_every_instance_and_conflicts_with_gcu_device_ids():
    cfg = engine_config_from_triton(model_config({"model_dir": "/m", "device_id": "3"}, TWO_CPU), args("llm_0_1"))
    assert cfg.device_id == 3
    with pytest.raises(ValueError, match="both gcu_device_ids and device_id"):
        engine_config_from_triton(model_config({"model_dir": "/m", "device_id": "3", "gcu_device_ids": "0;1"},
                                               TWO_CPU), args("llm_0_1"))


def test_bad_gcu_device_ids_are_rejected():
    with pytest.raises(ValueError, match="gcu_device_ids"):
        engine_config_from_triton(model_config({"model_dir": "/m", "gcu_device_ids": "0;x"}), args())


# -- serving-only options ----------------------------------------------------------------------------

def test_fault_injection_is_off_unless_set():
    assert serving_options(model_config({"model_dir": "/m"})).fault_inject_after_steps == 0
    assert serving_options(model_config({"fault_inject_after_steps": ""})).fault_inject_after_steps == 0
    assert serving_options(model_config({"fault_inject_after_steps": "12"})).fault_inject_after_steps == 12
    with pytest.raises(ValueError, match="fault_inject_after_steps"):
        serving_options(model_config({"fault_inject_after_steps": "-1"}))
    # serving options are accepted but never reach EngineConfig
    cfg = engine_config_from_triton(model_config({"model_dir": "/m", "fault_inject_after_steps": "5"}), args())
    assert not hasattr(cfg, "fault_inject_after_steps")


def test_stream_coalescing_is_on_unless_turned_off():
    assert serving_options(model_config({"model_dir": "/m"})).coalesce_stream_responses is True
    assert serving_options(model_config({"coalesce_stream_responses": "false"})).coalesce_stream_responses is False
    assert serving_options(model_config({"coalesce_stream_responses": "true"})).coalesce_stream_responses is True
    with pytest.raises(ValueError, match="coalesce_stream_responses must be a bool"):
        serving_options(model_config({"coalesce_stream_responses": "sometimes"}))


def test_shipped_llm_config_parameters_are_all_accepted(monkeypatch):
    """model_repository/llm/config.pbtxt: every parameter it sets is known (no load-time error)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "model_repository" / "llm" / "config.pbtxt").read_text()
    params = dict(re.findall(r'^[ \t]*parameters\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text, re.M))
    assert params, "no parameters found in the shipped llm config"
    monkeypatch.setenv(MODEL_DIR_ENV, "/models/env")
    cfg = engine_config_from_triton(model_config(params, [{"name": "llm_0", "count": 1}]), args())
    assert cfg.model_dir == (params.get("model_dir") or "/models/env")
