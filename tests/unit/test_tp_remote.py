"""The multi-host tensor-parallel settings and step channel without Paddle (loopback only):
tp_hosts parsing, the shared token, admission of remote ranks (token, rank, address checks; the
join timeout naming the missing ranks) and RemoteRank noticing a closed connection.
The engine with a rank in another network namespace: tests/model/test_tensor_parallel_multihost.py."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from paddle_llm_engine.config import parse_tp_hosts
from paddle_llm_engine.executor import remote
from paddle_llm_engine.executor.tp_worker import connect

TOKEN = b"unit-test-token-0123456789"


@pytest.mark.parametrize("text,size,want", [
    ("127.0.0.1,10.0.0.2", 2, [("127.0.0.1", 1), ("10.0.0.2", 1)]),
    ("hostA:2, hostB:2", 4, [("hostA", 2), ("hostB", 2)]),
    ("10.0.0.1:3,10.0.0.2", 4, [("10.0.0.1", 3), ("10.0.0.2", 1)]),
])
def test_parse_tp_hosts(text, size, want):
    assert parse_tp_hosts(text, size) == want


@pytest.mark.parametrize("text,size,words", [
    ("a,b", 3, "names 2 ranks but tensor_parallel_size is 3"),
    ("a,,b", 2, "bad entry"),
    ("a:x,b", 2, "bad entry"),
    ("a:0,b:2", 2, "at least 1 rank"),
    ("a,a", 2, "named twice"),
    ("a", 1, "needs tensor_parallel_size > 1"),
])
def test_parse_tp_hosts_errors_name_the_field(text, size, words):
    with pytest.raises(ValueError, match="tp_hosts") as err:
        parse_tp_hosts(text, size)
    assert words in str(err.value)


def test_token_from_env_or_file(tmp_path):
    assert remote.load_token({remote.TOKEN_ENV: " x" * 10}) == b"x x x x x x x x x x"
    f = tmp_path / "token"
    f.write_text(TOKEN.decode() + "\n")
    assert remote.load_token({remote.TOKEN_FILE_ENV: str(f)}) == TOKEN
    with pytest.raises(ValueError, match="PADDLE_LLM_TP_TOKEN"):
        remote.load_token({})
    with pytest.raises(ValueError, match="at least 16"):
        remote.load_token({remote.TOKEN_ENV: "short"})


def _join_in_thread(port: int, rank: int, token: bytes, out: list) -> threading.Thread:
    def run():
        try:
            out.append(connect(f"127.0.0.1:{port}", rank, 5.0, token))
        except BaseException as e:
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_admission_checks_token_rank_and_address(caplog):
    listener = remote.listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    results: dict[str, list] = {k: [] for k in ("bad_token", "bad_rank", "good")}
    try:
        # connected in this order (the listener's backlog is first come, first served)
        threads = [_join_in_thread(port, 1, b"wrong-token-0123456789", results["bad_token"])]
        time.sleep(0.3)
        threads.append(_join_in_thread(port, 5, TOKEN, results["bad_rank"]))
        time.sleep(0.3)
        threads.append(_join_in_thread(port, 1, TOKEN, results["good"]))
        joined = remote.accept_ranks(listener, {1: "127.0.0.1"}, TOKEN, 10.0)
        for t in threads[:2]:
            t.join(10)
    finally:
        listener.close()
    assert set(joined) == {1}
    assert isinstance(results["bad_token"][0], (remote.AuthenticationError, EOFError, OSError))
    assert "rejected rank 5" in str(results["bad_rank"][0])
    # the admitted rank waits for "init": the engine side sends its spec
    rr = joined[1]
    assert rr.poll() is None
    rr.kill()
    rr.conn.close()
    assert rr.poll() == 1


def test_wrong_address_is_rejected_and_missing_ranks_named():
    listener = remote.listen("127.0.0.1", 0)
    port = listener.getsockname()[1]
    out: list = []
    try:
        _join_in_thread(port, 1, TOKEN, out)  # comes from 127.0.0.1, but rank 1 belongs to 127.0.0.2
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"rank 1 on 127\.0\.0\.2 did not join within 2 s") as err:
            remote.accept_ranks(listener, {1: "127.0.0.2"}, TOKEN, 2.0)
        assert time.monotonic() - t0 < 5
        assert f"--connect 127.0.0.1:{port} --rank <r>" in str(err.value)
    finally:
        listener.close()
    deadline = time.monotonic() + 5
    while not out and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "belongs to tp_hosts entry '127.0.0.2'" in str(out[0])


def test_listen_refuses_a_foreign_address():
    with pytest.raises(ValueError, match="tp_hosts / tp_port: cannot listen on 192.0.2.1"):
        remote.listen("192.0.2.1", 0)


def test_remote_rank_sees_the_peer_exit():
    a, b = socket.socketpair()
    from multiprocessing.connection import Connection
    rr = remote.RemoteRank(1, "10.0.0.2", 123, Connection(a.detach()))
    assert rr.poll() is None
    b.close()
    assert rr.wait(2.0) == 1
    assert "lost its connection from 10.0.0.2" in rr.describe()
    rr.release()
    rr.conn.close()


def test_engine_config_validates_tp_hosts_and_the_triton_parameters_pass_it():
    from types import SimpleNamespace

    from paddle_llm_engine.config import EngineConfig
    from paddle_llm_triton.config_params import engine_config_from_triton

    model = SimpleNamespace(max_position_embeddings=128)  # all validate() reads of the model
    EngineConfig(model_dir="/m", tensor_parallel_size=2, tp_hosts="10.0.0.1,10.0.0.2").validate(model)
    with pytest.raises(ValueError, match="tp_hosts '10.0.0.1,10.0.0.2' names 2 ranks but tensor_parallel_size is 4"):
        EngineConfig(model_dir="/m", tensor_parallel_size=4, tp_hosts="10.0.0.1,10.0.0.2").validate(model)
    with pytest.raises(ValueError, match="tp_port must be in 1..65535"):
        EngineConfig(model_dir="/m", tensor_parallel_size=2, tp_hosts="a,b", tp_port=0).validate(model)
    with pytest.raises(ValueError, match="tp_join_timeout_s must be > 0"):
        EngineConfig(model_dir="/m", tensor_parallel_size=2, tp_hosts="a,b", tp_join_timeout_s=0).validate(model)
    cfg = {"parameters": {"model_dir": {"string_value": "/m"}, "tensor_parallel_size": {"string_value": "4"},
                          "tp_hosts": {"string_value": "10.0.0.1:2,10.0.0.2:2"}, "tp_port": {"string_value": "30000"}},
           "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    ec = engine_config_from_triton(cfg, {"model_name": "llm", "model_instance_name": "llm_0_1"})
    assert (ec.tp_hosts, ec.tp_port) == ("10.0.0.1:2,10.0.0.2:2", 30001)  # instance k listens on tp_port + k
