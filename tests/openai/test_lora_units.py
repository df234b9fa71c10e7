"""The frontend's LoRA parts without a server (paddle_llm_openai/lora.py): llm's refusals of runtime
loads -> vLLM's statuses and error bodies, the request bodies of vLLM's two routes, an adapter's model
card, and a completion's `model` naming an adapter -> llm's lora_name. End to end (a real server, the
openai SDK): tests/e2e/test_e2e_lora.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from paddle_llm_openai import params
from paddle_llm_openai.errors import classify
from paddle_llm_openai.lora import admin_error, not_found_route
from paddle_llm_openai.protocol import LoadLoraAdapterRequest, ModelCard, UnloadLoraAdapterRequest


@pytest.mark.parametrize("message, status, type_, param, text", [
    ("lora_name: The lora adapter 'x' has already been loaded. If you want to load the adapter in place, set "
     "'load_inplace' to True.", 400, "InvalidUserInput", "lora_name", "The lora adapter 'x' has already been loaded."),
    ("lora_name: The lora adapter 'x' cannot be found.", 404, "NotFoundError", "lora_name",
     "The lora adapter 'x' cannot be found."),
    ("lora_path: Loading lora x failed: No adapter found for /data/x", 404, "NotFoundError", "lora_path",
     "Loading lora x failed: No adapter found for /data/x"),
    ("lora_path: '../x' resolves outside lora_root (/data): runtime-loaded adapters must lie under it", 400,
     "BadRequestError", "lora_path", "resolves outside lora_root"),
    ("r: LoRA adapter 'x': model.layers.0.self_attn.q_proj has rank 64, above max_lora_rank 16", 400,
     "BadRequestError", "r", "above max_lora_rank"),
    ("lora_admin: refused: the request does not carry the server's PADDLE_LLM_LORA_ADMIN_KEY", 500,
     "InternalServerError", None, "PADDLE_LLM_LORA_ADMIN_KEY"),
    ("lora_admin: llm instance llm_0_1 did not answer within 10 s; nothing was changed", 500,
     "InternalServerError", None, "did not answer"),
    ("StatusCode.UNAVAILABLE: failed to connect to all addresses", 503, "service_unavailable", None, "not reachable"),
])
def test_admin_errors_get_vllms_status_and_body(message, status, type_, param, text):
    e = admin_error(message)
    body = e.body()["error"]
    assert (e.status, body["type"], body["param"]) == (status, type_, param)
    assert text in body["message"] and not body["message"].startswith(f"{param}: ")
    if status != 503:
        assert body["code"] == status  # vLLM's ErrorResponse carries the HTTP status as code


def test_a_route_that_is_off_answers_like_an_unknown_route():
    e = not_found_route()
    assert (e.status, e.body()["error"]) == (404, {"message": "Not Found", "type": "invalid_request_error",
                                                   "param": None, "code": None})


def test_vllms_request_bodies():
    r = LoadLoraAdapterRequest(lora_name="sql", lora_path="/data/sql")
    assert (r.lora_name, r.lora_path, r.load_inplace) == ("sql", "/data/sql", False)
    assert LoadLoraAdapterRequest().lora_name is None  # missing: answered with vLLM's own 400 (lora.py)
    assert UnloadLoraAdapterRequest(lora_name="sql", lora_int_id=3).lora_name == "sql"
    with pytest.raises(ValidationError):
        LoadLoraAdapterRequest(lora_name="sql", lora_path="/x", other=1)


def test_an_adapters_card_and_a_base_card():
    card = ModelCard(id="sql", created=1, root="/data/sql", parent="SmolLM2").model_dump()
    assert (card["object"], card["root"], card["parent"]) == ("model", "/data/sql", "SmolLM2")
    base = ModelCard(id="llm", created=1).model_dump()
    assert base["root"] is None and base["parent"] is None


def test_the_model_of_a_request_becomes_lora_name_and_its_errors_name_model():
    sp, names = {}, {}
    params.add_lora(sp, names, "sql")
    assert sp == {"lora_name": "sql"} and names["sampling_parameters.lora_name"] == "model"
    sp = {}
    params.add_lora(sp, names, None)
    assert sp == {}
    e = classify("sampling_parameters.lora_name: unknown LoRA adapter 'sql' (loaded: chat)", names)
    assert (e.status, e.param, e.code) == (404, "model", "model_not_found") and "'sql'" in e.message
