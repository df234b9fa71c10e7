"""The OpenAI frontend's readiness gate (app.Frontend.serving) without a server: it follows `llm`'s own
readiness, not the server's (Triton reports the server not ready while the supervisor reloads another
model, e.g. a tensor-parallel one, and `llm` serves meanwhile: the soak saw /v1 answer 503 then); a
ready answer is trusted for READY_TTL_S and a not-ready one is asked again on the next request."""

from __future__ import annotations

import asyncio

from paddle_llm_openai import app as app_mod
from paddle_llm_openai.app import Frontend


class StandInLLM:
    """What Frontend.serving asks of the gRPC client."""

    def __init__(self, model_ready: bool, server_ready: bool):
        self.model, self.server, self.asked = model_ready, server_ready, 0

    async def is_model_ready(self) -> bool:
        self.asked += 1
        return self.model

    async def is_ready(self) -> bool:  # server and model: what /health/ready reports
        return self.server and self.model

    async def model_config(self) -> dict:
        return {"parameters": {"max_model_len": {"string_value": "4096"}}}


def _frontend(llm) -> Frontend:
    fe = Frontend("127.0.0.1:1", "llm", ["llm"], None, None)
    fe.llm = llm
    return fe


def test_llm_ready_serves_even_while_the_server_says_not_ready():
    fe = _frontend(StandInLLM(model_ready=True, server_ready=False))
    assert asyncio.run(fe.serving()) is True
    assert fe.max_model_len() == 4096


def test_llm_not_ready_refuses_and_is_asked_again_next_time(monkeypatch):
    llm = StandInLLM(model_ready=False, server_ready=True)
    fe = _frontend(llm)
    assert asyncio.run(fe.serving()) is False and asyncio.run(fe.serving()) is False
    assert llm.asked == 2
    llm.model = True
    assert asyncio.run(fe.serving()) is True
    asked = llm.asked
    assert asyncio.run(fe.serving()) is True and llm.asked == asked  # trusted for READY_TTL_S
    monkeypatch.setattr(app_mod, "READY_TTL_S", 0.0)
    llm.model = False
    assert asyncio.run(fe.serving()) is False
