"""Two replicas of the server of `make serve` behind a real HAProxy (deploy/haproxy/haproxy.cfg), on loopback.

Each replica is scripts/launch_triton.py (what `make serve` runs: supervised tritonserver) on a copy of
the repository with the default model, started through tests/support/supervised.py with the recipe's accept
window DRAIN_ACCEPT_S. HAProxy is Debian's package (deploy/haproxy/install_haproxy.sh: $HAPROXY, an
earlier copy in build/haproxy/, `haproxy` on PATH, else `apt-get download` + `dpkg-deb -x`; an HAProxy
that cannot be had fails the test with the script's reason, it is never skipped), running the shipped
recipe with only its ports rendered into a copy.

CLIENTS clients (load_clients.py, a process of its own) send mixed requests through HAProxy, one at a
time each: gRPC streams to `llm` and `ensemble` (tritonclient), HTTP generate and generate_stream to
both. Every request must end normally with all of its MAX_TOKENS tokens. The test then
1. waits until each replica's own metrics count served requests (both serve);
2. SIGTERMs replica 1's launcher while it has requests running, sends a BURST of requests at once as
   soon as its readiness is false (some of which HAProxy, not knowing yet, routes to it), and measures
   from HAProxy's stats when it marks replica 1 DOWN in both backends, and from HAProxy's log the last
   request routed to it;
3. waits for that launcher to exit 0 after a clean drain, starts the replica again on the same ports
   and waits until its own metrics count requests served (it takes load again);
4. stops the clients and asserts zero client-visible failures, one HAProxy log line with status 200 for
   every client request, requests in flight on replica 1 at the SIGTERM, requests HAProxy sent to it
   after the SIGTERM on both protocols (served, as every request), and the DOWN within the accept
   window (the condition for no refusal to reach a client).
Every wait is bounded; the figures are printed (run with -s) and written to build/test-logs/scaleout.json.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from unittest import mock

import pytest
import requests

from clients import scrape_metrics
import paddle_llm_launcher as launcher
from paddle_llm_launcher import procs
from repo_edit import copy_repository, set_config_parameter
from supervised import SupervisedServer
from installers import installed_binary

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "deploy" / "haproxy" / "haproxy.cfg"
INSTALL = REPO / "deploy" / "haproxy" / "install_haproxy.sh"
LOAD = Path(__file__).resolve().parent / "load_clients.py"
SUMMARY = REPO / "build" / "test-logs" / "scaleout.json"

# the recipe's DRAIN_ACCEPT_S, read from haproxy.cfg's header so that the two cannot drift apart;
# SCALEOUT_DRAIN_ACCEPT_S=0 runs the replicas with the default refuse-at-once drain instead, to see the
# failures the accept window prevents (the test then fails)
RECIPE_ACCEPT_S = float(re.search(r"DRAIN_ACCEPT_S=([0-9.]+)", RECIPE.read_text()).group(1))
ACCEPT_S = float(os.environ.get("SCALEOUT_DRAIN_ACCEPT_S", RECIPE_ACCEPT_S))
# the longest HAProxy may take to mark a replica DOWN once its readiness is false, from the recipe's
# checks: `fall` failed checks `inter` apart (the first within one `inter`), each at most `timeout check`
_CHECKS = re.search(r"default-server check inter (\d+)s fall (\d+)", RECIPE.read_text())
CHECK_BOUND_S = (int(_CHECKS.group(1)) * int(_CHECKS.group(2))
                 + int(re.search(r"timeout check (\d+)s", RECIPE.read_text()).group(1)))
CLIENTS = 4
MAX_TOKENS = 16
REQUEST_S = 120.0    # hard bound of one request (a loaded 2-core host)
READY_S = 300.0      # hard bound of a replica's start
SERVED_BEFORE = 3    # requests each replica's metrics must count before the SIGTERM / after its restart
# the recipe's ports -> the test's: placeholders matched as whole "127.0.0.1:PORT" / "port PORT"
RECIPE_PORTS = {"lb_http": 8000, "lb_grpc": 8001, "lb_openai": 9000, "stats": 8404,
                "r0_http": 8100, "r0_grpc": 8101, "r0_openai": 8103,
                "r1_http": 8200, "r1_grpc": 8201, "r1_openai": 8203}
API_KEY = "sk-scaleout-test-0123456789"  # the replicas' VLLM_API_KEY (the recipe: one key for all)


# -- HAProxy ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def haproxy_bin() -> str:
    return installed_binary(INSTALL, "HAProxy for the scale-out test")


def render_recipe(ports: dict[str, int]) -> str:
    """haproxy.cfg with each recipe port replaced by ports[name] (RECIPE_PORTS names); ValueError if a
    recipe port is missing from the file (the recipe and this test drifted apart)."""
    text = RECIPE.read_text()
    for name, old in RECIPE_PORTS.items():
        pat = re.compile(rf"(127\.0\.0\.1:|\bport ){old}\b")
        if not pat.search(text):
            raise ValueError(f"{RECIPE.name} has no 127.0.0.1:{old} ({name})")
        text = pat.sub(lambda m: f"{m.group(1)}{ports[name]}", text)
    return text


class HAProxy:
    """The recipe's HAProxy on rendered ports, in the foreground (-db), its log in a file."""

    def __init__(self, binary: str, ports: dict[str, int], tmp: Path):
        self.ports = ports
        self.cfg = tmp / "haproxy.cfg"
        self.cfg.write_text(render_recipe(ports))
        self.log_path = tmp / "haproxy.log"
        self._out = open(self.log_path, "wb")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(self.cfg)], stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp,
                                     preexec_fn=procs.set_parent_death_signal)
        self.http_base = f"http://127.0.0.1:{ports['lb_http']}"
        self.grpc_url = f"127.0.0.1:{ports['lb_grpc']}"

    def status(self) -> dict[tuple[str, str], str]:
        """{(backend, server): HAProxy's status, e.g. "UP", "DOWN", "UP 1/2"} from /stats;csv."""
        r = requests.get(f"http://127.0.0.1:{self.ports['stats']}/stats;csv", timeout=5)
        rows = csv.DictReader(io.StringIO(r.text.lstrip("# ")))
        return {(row["pxname"], row["svname"]): row["status"] for row in rows
                if row["svname"] not in ("FRONTEND", "BACKEND")}

    def server_state(self, server: str) -> set[str]:
        """The statuses of `server` in the two backends (a set: {"UP"} once both agree)."""
        try:
            st = self.status()
        except (requests.RequestException, KeyError):
            return set()
        return {st.get((b, server), "?") for b in ("triton_http", "triton_grpc", "openai")}

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


# one line of `option httplog`: client [accept date] frontend backend/server Tq/Tw/Tc/Tr/Ta status ...
_HTTPLOG = re.compile(r"\[(\d+/\w+/\d+:\d+:\d+:\d+\.\d+)\] (triton_http|triton_grpc)~? (\S+)/(\S+) "
                      r"(-?\d+)/(-?\d+)/(-?\d+)/(-?\d+)/(\+?-?\d+) (-?\d+) ")


def parse_requests(log: str) -> list[dict]:
    """The request lines of HAProxy's log: accepted (epoch s, local time as HAProxy writes it),
    frontend, server, total_s, status."""
    out = []
    for m in _HTTPLOG.finditer(log):
        accepted = datetime.strptime(m.group(1), "%d/%b/%Y:%H:%M:%S.%f").timestamp()
        out.append({"accepted": accepted, "frontend": m.group(2), "server": m.group(4),
                    "total_s": int(m.group(9).lstrip("+")) / 1000.0, "status": int(m.group(10))})
    return out


# -- replicas --------------------------------------------------------------------------------------

@contextlib.contextmanager
def _replica_env(ports=None):
    """The environment and ports a replica starts with: DRAIN_ACCEPT_S of the recipe (the launcher
    reads it at start; SupervisedServer passes this process's environment on), and, for a restart,
    the replica's old ports (SupervisedServer takes launcher.free_ports(3); HAProxy knows those)."""
    old = os.environ.get("DRAIN_ACCEPT_S")
    os.environ["DRAIN_ACCEPT_S"] = str(ACCEPT_S)
    try:
        with mock.patch.object(launcher, "free_ports", lambda n=3: list(ports)) if ports else contextlib.nullcontext():
            yield
    finally:
        if old is None:
            os.environ.pop("DRAIN_ACCEPT_S", None)
        else:
            os.environ["DRAIN_ACCEPT_S"] = old


def start_replica(repo: Path, model_dir: str, log: Path, ports=None, openai_port: int | None = None) -> SupervisedServer:
    """A replica's launcher (not waiting for it), with its OpenAI frontend on `openai_port` (default a
    free one; kept as .openai_port) behind the API key."""
    openai_port = openai_port or launcher.free_port()
    with _replica_env(ports):
        s = SupervisedServer(repo, model_dir, log, drain_grace=30.0, extra=("--openai-port", str(openai_port)),
                             env={"VLLM_API_KEY": API_KEY})
    s.openai_port = openai_port
    return s


def served(s: SupervisedServer) -> float:
    """Requests this replica's engine finished (llm_requests_total; an ensemble request counts there too)."""
    return scrape_metrics(s.metrics_url).value("llm_requests_total")


def running(s: SupervisedServer) -> float:
    return scrape_metrics(s.metrics_url).value("llm_num_requests_running")


def wait_for(pred, timeout: float, what: str, poll: float = 0.05) -> float:
    """Poll pred() until true; seconds it took. AssertionError after `timeout` s."""
    t0 = time.monotonic()
    while True:
        try:
            if pred():
                return time.monotonic() - t0
        except (requests.RequestException, OSError):
            pass  # an endpoint not up yet / gone: keep polling until the bound
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not {what} within {timeout:.0f} s")
        time.sleep(poll)


# -- load ------------------------------------------------------------------------------------------

# the launcher's line when the drain turns readiness false (paddle_llm_launcher/shutdown.py), with its UTC time
GATE_CLOSED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) launch_triton: (?:readiness false|draining:)", re.M)

# Right after the SIGTERM, once the replica's readiness is false but before HAProxy's checks saw it
# (`fall` 2 x `inter` 1 s), this many requests arrive at once, half per backend (gRPC, HTTP): leastconn
# then hands the draining replica at least one of each half, since neither backend holds more than
# CLIENTS requests of the steady load (CLIENTS + 2 new ones cannot all go to the other replica). These
# are the requests a refuse-at-once drain would fail.
BURST = 2 * (CLIENTS + 2)


class LoadProcess:
    """load_clients.py (its own process: see its doc) sending through HAProxy; stopped by PID."""

    def __init__(self, lb: HAProxy, tmp: Path):
        self.records_path = tmp / "records.jsonl"
        self.log_path = tmp / "load_clients.log"
        self._out = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(LOAD), "--http-base", lb.http_base, "--grpc-url", lb.grpc_url,
             "--out", str(self.records_path), "--clients", str(CLIENTS), "--max-tokens", str(MAX_TOKENS),
             "--burst", str(BURST), "--request-timeout", str(REQUEST_S)],
            stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
            preexec_fn=procs.set_parent_death_signal)
        # its SIGUSR1 handler must be in place before burst() (the default action would end it)
        wait_for(lambda: b"started" in self.log_path.read_bytes() or self.proc.poll() is not None, 60,
                 "load clients started")
        assert self.proc.poll() is None, self.log_path.read_text(errors="replace")[-3000:]

    def burst(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)

    def stop(self) -> list[dict]:
        """SIGTERM: the requests in flight end, then it exits; returns every request's record."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(REQUEST_S + 20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            code = "killed"
        self._out.close()
        assert code == 0, f"load clients exit {code}:\n{self.log_path.read_text(errors='replace')[-3000:]}"
        text = self.records_path.read_text() if self.records_path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- the test --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory, smollm2_dir, haproxy_bin):
    """Two replicas (started side by side) and HAProxy in front once both are ready. Yields a dict the
    test adds the restarted replica to; everything is stopped at the end, by PID."""
    tmp = tmp_path_factory.mktemp("scaleout")

    def edit(repo):
        cfg = repo / "llm" / "config.pbtxt"
        set_config_parameter(cfg, "num_kv_blocks", "64")  # a small KV cache: quicker start, enough here
        set_config_parameter(cfg, "max_model_len", "2048")

    repo = copy_repository(tmp / "model_repository", edit=edit)
    c = {"tmp": tmp, "repo": repo, "model_dir": smollm2_dir, "replicas": [], "lb": None}
    try:
        c["replicas"] = [start_replica(repo, smollm2_dir, tmp / f"replica{i}.log") for i in range(2)]
        for r in c["replicas"]:
            r.wait(r.ready, READY_S, "ready")
        r0, r1 = c["replicas"]
        ports = dict(zip(("lb_http", "lb_grpc", "lb_openai", "stats"), launcher.free_ports(4)),
                     r0_http=r0.http_port, r0_grpc=r0.grpc_port, r0_openai=r0.openai_port,
                     r1_http=r1.http_port, r1_grpc=r1.grpc_port, r1_openai=r1.openai_port)
        c["lb"] = HAProxy(haproxy_bin, ports, tmp)
        for name in ("replica1", "replica2"):
            wait_for(lambda: c["lb"].server_state(name) == {"UP"}, 30, f"HAProxy: {name} UP")
        yield c
    finally:
        stoppers = [threading.Thread(target=r.stop, daemon=True) for r in c["replicas"]]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(120)
        if c["lb"] is not None:
            c["lb"].stop()


def _sigterm_and_watch(lb: HAProxy, victim: SupervisedServer, load: LoadProcess) -> dict:
    """SIGTERM the victim's launcher with requests of its own running, then a BURST of requests;
    returns when HAProxy has marked it DOWN in both backends: t_term (epoch s), down_after_s per backend."""
    wait_for(lambda: running(victim) >= 1, 60, "replica 1 running a request before the SIGTERM")
    log_from = len(victim.output())
    t_term = time.time()
    victim.signal(signal.SIGTERM)
    # the burst goes out once the replica's readiness is false, the earliest a load balancer could know:
    # a refuse-at-once drain refuses from that moment on, HAProxy needs `fall` failed checks more. The
    # moment is the launcher's own line (UTC ms), read from its log: a readiness poll over HTTP takes
    # seconds to be answered on a loaded host, HAProxy's checks do not wait for it.
    closed = wait_for(lambda: GATE_CLOSED.search(victim.output(), log_from), 30,
                      "replica 1's launcher: readiness false after the SIGTERM", poll=0.02)
    load.burst()
    stamp = GATE_CLOSED.search(victim.output(), log_from).group(1)
    not_ready = datetime.strptime(stamp + "+0000", "%Y-%m-%d %H:%M:%S.%f%z").timestamp() - t_term
    assert not_ready <= closed + 0.5, (stamp, t_term, closed)  # the launcher's clock is this host's
    down: dict[str, float] = {}
    deadline = time.monotonic() + 30
    while len(down) < 2 and time.monotonic() < deadline:
        try:
            st = lb.status()
        except requests.RequestException:
            st = {}
        for be in ("triton_http", "triton_grpc"):
            if be not in down and st.get((be, "replica1"), "").startswith("DOWN"):
                down[be] = time.time() - t_term
        time.sleep(0.02)
    assert len(down) == 2, f"HAProxy did not mark replica1 DOWN in both backends within 30 s: {down}"
    return {"t_term": t_term, "not_ready_after_s": not_ready, "down_after_s": down}


def test_the_recipe_refuses_admin_apis_and_big_bodies_and_passes_the_openai_key(cluster):
    """Through HAProxy: Triton's repository, shared-memory, trace and logging APIs are 403 on both
    protocols (even with a replica's admin header: an operator calls the replica itself); a body
    declared above 8 MiB is 413 before it is sent; the OpenAI API answers 401 without the replicas'
    key and serves with it, streamed and not."""
    import openai
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    lb: HAProxy = cluster["lb"]
    for path in ("/v2/repository/index", "/v2/repository/models/llm/unload", "/v2/systemsharedmemory/status",
                 "/v2/trace/setting", "/v2/models/llm/trace/setting", "/v2/logging"):
        r = requests.post(lb.http_base + path, json={}, headers={"paddle-llm-admin-key": "x" * 20}, timeout=10)
        assert r.status_code == 403 and "restricted" not in r.text, (path, r.status_code, r.text)  # HAProxy's
    client = grpcclient.InferenceServerClient(lb.grpc_url)
    for call in (client.get_model_repository_index, lambda: client.unload_model("llm"),
                 client.get_system_shared_memory_status):
        with pytest.raises(InferenceServerException):
            call()
    assert client.is_model_ready("llm")  # inference and health pass
    client.close()
    with socket.create_connection(("127.0.0.1", lb.ports["lb_http"]), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/llm/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 52428800\r\n\r\n")
        assert sock.recv(200).startswith(b"HTTP/1.1 413"), "a 50 MB body was not refused at once"
    base = f"http://127.0.0.1:{lb.ports['lb_openai']}/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0, timeout=60).models.list()
    oc = openai.OpenAI(base_url=base, api_key=API_KEY, max_retries=0, timeout=REQUEST_S)
    msg = [{"role": "user", "content": "Say hi"}]
    whole = oc.chat.completions.create(model="llm", messages=msg, max_tokens=8, temperature=0)
    parts = [c.choices[0].delta.content or "" for c in oc.chat.completions.create(
        model="llm", messages=msg, max_tokens=8, temperature=0, stream=True) if c.choices]
    assert whole.choices[0].message.content and "".join(parts) == whole.choices[0].message.content


def test_two_replicas_behind_haproxy_drain_and_come_back_with_zero_failures(cluster):
    t_start = time.monotonic()
    lb: HAProxy = cluster["lb"]
    r0, r1 = cluster["replicas"]
    log_from = len(lb.log_text())  # the lines of earlier tests (the recipe's refusals) are not this load's
    load = LoadProcess(lb, cluster["tmp"])
    try:
        # 1. both replicas serve (their own metrics)
        wait_for(lambda: served(r0) >= SERVED_BEFORE and served(r1) >= SERVED_BEFORE, 120,
                 f"{SERVED_BEFORE} requests served by each replica")
        before = {"replica1": served(r0), "replica2": served(r1)}
        # 2. SIGTERM replica 1 mid-load; HAProxy marks it DOWN
        term = _sigterm_and_watch(lb, r0, load)
        # 3. it drains and exits 0, comes back on the same ports, takes load again
        code = r0.proc.wait(150)
        drained_after = time.time() - term["t_term"]
        assert code == 0, r0.output()[-3000:]
        assert re.search(r"drained in [0-9.]+ s \(0 request\(s\) were still in flight", r0.output()), r0.output()[-2000:]
        back = start_replica(cluster["repo"], cluster["model_dir"], cluster["tmp"] / "replica0_restart.log",
                             ports=(r0.http_port, r0.grpc_port, r0.metrics_port), openai_port=r0.openai_port)
        cluster["replicas"].append(back)
        back.wait(back.ready, READY_S, "ready again")
        up_after = wait_for(lambda: lb.server_state("replica1") == {"UP"}, 30, "HAProxy: replica1 UP again")
        wait_for(lambda: served(back) >= SERVED_BEFORE, 120, "the restarted replica serving")
        served_again = served(back)
    finally:
        records = load.stop()
    _judge(lb, records, term, before, served_again, drained_after, up_after, time.monotonic() - t_start, log_from)


def _judge(lb, records, term, before, served_again, drained_after, up_after, body_s, log_from=0) -> None:
    failures = [r for r in records if r["failure"]]
    logged = parse_requests(lb.log_text()[log_from:])
    t_term = term["t_term"]
    to_victim = [q for q in logged if q["server"] == "replica1"]
    # before the restart: requests HAProxy handed replica 1 after the SIGTERM, and those in flight then
    after_term = [q for q in to_victim if t_term <= q["accepted"] < t_term + drained_after]
    in_flight = [q for q in to_victim if q["accepted"] < t_term < q["accepted"] + q["total_s"]]
    last_after = max((q["accepted"] - t_term for q in after_term), default=None)
    per_frontend = {fe: sum(q["frontend"] == fe for q in after_term) for fe in ("triton_http", "triton_grpc")}
    # the last request each backend handed replica 1 after the SIGTERM, against when it marked it DOWN
    late = {fe: max(q["accepted"] - t_term for q in after_term if q["frontend"] == fe)
            for fe in per_frontend if per_frontend[fe]}
    down, not_ready = term["down_after_s"], term["not_ready_after_s"]
    burst_sent = sorted(r["start"] - t_term for r in records if r.get("burst"))
    summary = {
        "requests": len(records), "failures": len(failures),
        "by_kind": {k: sum(r["kind"] == k for r in records) for k in sorted({r["kind"] for r in records})},
        "haproxy_log_lines": len(logged), "by_server": {s: sum(q["server"] == s for q in logged)
                                                        for s in ("replica1", "replica2")},
        "served_before_sigterm": before, "served_by_restarted_replica": served_again,
        "in_flight_at_sigterm_via_haproxy": len(in_flight),
        "routed_to_draining_replica_after_sigterm": per_frontend,
        "not_ready_after_s": term["not_ready_after_s"], "last_routed_after_sigterm_s": last_after,
        "burst_sent_after_s": [round(x, 3) for x in burst_sent[:1] + burst_sent[-1:]],
        "down_after_s": down, "check_bound_s": CHECK_BOUND_S,
        "launcher_exit_after_s": drained_after, "up_again_after_ready_s": up_after, "test_body_s": body_s,
    }
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=1))
    print(f"\n[scaleout] {json.dumps(summary)}")
    assert not failures, f"{len(failures)} client-visible failures of {len(records)}: {failures[:5]}"
    # every client request went through HAProxy once, and HAProxy answered each with 200
    assert len(logged) == len(records), (len(logged), len(records))
    assert all(q["status"] == 200 for q in logged), [q for q in logged if q["status"] != 200][:5]
    assert in_flight, "no request of replica 1 was in flight through HAProxy at the SIGTERM"
    # the burst went out while HAProxy still routed to replica 1 (armed threads, released at once) ...
    assert len(burst_sent) == BURST, (len(burst_sent), BURST)
    assert burst_sent[-1] < min(down.values()), (
        f"the burst went out {burst_sent[0]:.3f}-{burst_sent[-1]:.3f} s after the SIGTERM, not before HAProxy "
        f"marked replica1 DOWN ({down}): the load process was too slow to send it")
    # ... and reached the draining replica on both protocols (and was served: no failures above)
    assert all(per_frontend.values()), (per_frontend, burst_sent)
    # HAProxy stopped routing to it within its checks: `fall` failed checks `inter` apart, each bounded
    # by `timeout check`, after readiness turned false (0.5 s: the stats and readiness polls, and the
    # check a few ms behind a busy host), and sent it nothing after marking it DOWN
    assert max(down.values()) - not_ready <= CHECK_BOUND_S + 0.5, (down, not_ready, CHECK_BOUND_S)
    assert all(late[fe] <= down[fe] for fe in late), (late, down)
    # ... and before it began refusing: the recipe's accept window covers that bound, and did here
    assert CHECK_BOUND_S < RECIPE_ACCEPT_S, (CHECK_BOUND_S, RECIPE_ACCEPT_S)
    assert max(down.values()) < ACCEPT_S, down
