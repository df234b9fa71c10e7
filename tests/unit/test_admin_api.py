"""The restricted-API policy the launcher starts tritonserver with (paddle_llm_launcher/admin_api.py): which APIs,
the key (per start, or the operator's), the flags and headers in Triton's formats, the refusals of bad
settings. The real server's answers are checked end to end in tests/e2e/test_e2e_reliability.py."""

from __future__ import annotations

import pytest

from paddle_llm_launcher import admin_api
from paddle_llm_launcher.admin_api import AdminAccess, admin_access, parse_apis


def test_default_restricts_what_changes_the_server_and_leaves_serving_open():
    a = admin_access({})
    assert a.apis == ("model-repository", "shared-memory", "trace", "logging")
    for open_api in ("health", "metadata", "inference", "model-config", "statistics"):
        assert open_api not in a.apis


def test_each_start_gets_its_own_secret_and_repr_never_shows_it():
    a, b = admin_access({}), admin_access({})
    assert a.key != b.key and len(a.key) >= 40  # token_urlsafe(32): 43 characters
    assert a.key not in repr(a)


def test_flags_and_headers_use_tritons_formats():
    a = AdminAccess(("model-repository", "shared-memory"), "K" * 20)
    spec = "model-repository,shared-memory:paddle-llm-admin-key=" + "K" * 20
    assert a.server_args() == ["--http-restricted-api=" + spec, "--grpc-restricted-protocol=" + spec]
    assert a.http_headers() == {"paddle-llm-admin-key": "K" * 20}
    # Triton 2.51 expects gRPC metadata named triton-grpc-protocol-<key> (measured: its refusal names it)
    assert a.grpc_headers() == {"triton-grpc-protocol-paddle-llm-admin-key": "K" * 20}


def test_none_opens_everything_and_sends_no_flags():
    a = admin_access({"TRITON_RESTRICTED_APIS": "none"})
    assert a.apis == () and a.server_args() == [] and a.http_headers() == {}


def test_an_operator_list_and_key_are_used():
    a = admin_access({"TRITON_RESTRICTED_APIS": "model-repository, statistics,model-repository",
                      "TRITON_ADMIN_KEY": "operator-chosen-key-0123"})
    assert a.apis == ("model-repository", "statistics")
    assert a.key == "operator-chosen-key-0123"


@pytest.mark.parametrize("raw", ["model-repo", "model-repository,bogus", ",", "all"])
def test_an_unknown_api_name_is_refused_naming_the_variable(raw):
    with pytest.raises(ValueError, match="TRITON_RESTRICTED_APIS: unknown API name"):
        parse_apis(raw)


@pytest.mark.parametrize("key", ["short", "has space in it 12345", "with=equals-sign-123", "comma,comma,comma,,,"])
def test_a_weak_or_unquotable_key_is_refused_naming_the_variable(key):
    with pytest.raises(ValueError, match="TRITON_ADMIN_KEY: must be at least 16 characters"):
        admin_access({"TRITON_ADMIN_KEY": key})


def test_operator_restricted_flags_conflict_with_the_launchers():
    with pytest.raises(ValueError, match="--http-restricted-api is set by the launcher"):
        admin_access({}, ["--log-verbose", "1", "--http-restricted-api=inference:a=b"])


def test_start_server_puts_the_flags_on_the_command_and_the_key_on_the_handle(monkeypatch, tmp_path):
    """Every server start restricts (supervised or not); the handle carries the header its repository
    calls need. Nothing is spawned: Popen is replaced by a recorder."""
    from paddle_llm_launcher import server as server_mod

    backend = tmp_path / "backends"
    (backend / "python").mkdir(parents=True)
    (backend / "python" / "triton_python_backend_stub").write_text("")
    monkeypatch.setattr(server_mod, "tritonserver_binary", lambda: tmp_path / "tritonserver")
    seen = {}

    class Proc:
        pid = 4242

        def poll(self):
            return None

    def fake_popen(launch, log_path, mode):
        seen["cmd"] = launch[0]
        return Proc()

    monkeypatch.setattr(server_mod, "_popen", fake_popen)
    monkeypatch.delenv("TRITON_RESTRICTED_APIS", raising=False)
    monkeypatch.delenv("TRITON_ADMIN_KEY", raising=False)
    handle = server_mod.start_server(tmp_path, 1, 2, 3, backend_dir=backend)
    key = handle.admin.key
    assert handle.admin_headers == {admin_api.ADMIN_HEADER: key}
    flags = [a for a in seen["cmd"] if a.startswith("--http-restricted-api=") or a.startswith("--grpc-restricted")]
    assert len(flags) == 2 and all(f.endswith(f":paddle-llm-admin-key={key}") for f in flags)


def test_the_lora_admin_key_is_the_operators_or_one_per_launcher_process_shared_by_server_and_frontend():
    from paddle_llm_launcher.environment import server_env

    mine = admin_api.lora_admin_key({})
    assert len(mine) >= 40 and admin_api.lora_admin_key({}) == mine  # made once per process
    assert admin_api.lora_admin_key({admin_api.LORA_KEY_ENV: "o" * 20}) == "o" * 20
    with pytest.raises(ValueError, match="PADDLE_LLM_LORA_ADMIN_KEY"):
        admin_api.lora_admin_key({admin_api.LORA_KEY_ENV: "short"})
    assert server_env(None, {})[admin_api.LORA_KEY_ENV] == mine
    assert server_env(None, {admin_api.LORA_KEY_ENV: "p" * 20})[admin_api.LORA_KEY_ENV] == "p" * 20
    # the llm model and the OpenAI frontend (its cli.py read as text: no fastapi below Python 3.11) read
    # the variable of the same name
    from pathlib import Path

    from paddle_llm_triton.config_params import LORA_ADMIN_KEY_ENV as model_name
    cli = (Path(admin_api.__file__).parents[1] / "paddle_llm_openai" / "cli.py").read_text()
    assert admin_api.LORA_KEY_ENV == model_name and f'LORA_KEY_ENV = "{model_name}"' in cli
