"""The Grafana dashboard (deploy/grafana/paddle-llm-dashboard.json) against a real Prometheus.

A Prometheus of Debian's `prometheus` package (deploy/prometheus/install_prometheus.sh: $PROMETHEUS, an
earlier unpacked copy in build/prometheus/, `prometheus` on PATH, else `apt-get download prometheus` +
`dpkg-deb -x`; a Prometheus that cannot be had is a failure with the script's reason, never a skip)
runs on 127.0.0.1 with a temporary data directory and the shipped scrape config
(deploy/prometheus/prometheus.yml: its job and relabel rules, the target and the scrape interval
replaced by the session server's metrics port and 1 s). It scrapes the session `triton_server` while
CLIENTS (4) clients stream requests with a shared prompt prefix for LOAD_S (10) seconds and two
requests with a bad sampling parameter are refused. Then every template
variable of the dashboard is resolved through Prometheus's API (label_values(...) as /api/v1/series),
and every panel query, with the variables substituted (the server variable once as "All" and once as
the one server), must return through /api/v1/query_range at least one series with a finite value in
the load window: a panel that would be empty fails. The results go to
build/dashboard/query_results.json, which deploy/grafana/render_panels.py draws as docs/images/dashboard.png.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from clients import llm_stream
from installers import installed_binary
import paddle_llm_launcher as launcher

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "paddle-llm-dashboard.json"
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
INSTALL = REPO / "deploy" / "prometheus" / "install_prometheus.sh"
RESULTS = REPO / "build" / "dashboard" / "query_results.json"

SCRAPE_S = 1
RATE_INTERVAL = "5s"  # Grafana's $__rate_interval for a 1 s scrape interval: max(4 x scrape, step + scrape)
LOAD_S = 10.0
CLIENTS = 4
# a shared prefix of about 195 tokens, three KV blocks of 64: the prefix-cache panel has hits to show
PREFIX = " ".join(f"Rule {i}: answer briefly, stay on topic and keep every answer short." for i in range(12)) + " "
INVALID = 2  # refused requests (bad sampling_parameters) so that the rejections panel shows a rate


# -- Prometheus -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prometheus_bin() -> str:
    return installed_binary(INSTALL, "Prometheus for the dashboard test")


def _get(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


class Prometheus:
    def __init__(self, base: str):
        self.base = base

    def api(self, path: str, **params) -> dict:
        q = urllib.parse.urlencode(params, doseq=True)
        body = _get(f"{self.base}/api/v1/{path}?{q}")
        assert body.get("status") == "success", body
        return body["data"]

    def instant(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step)["result"]


@pytest.fixture(scope="module")
def prometheus(prometheus_bin, triton_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prometheus")
    cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
    cfg["global"]["scrape_interval"] = f"{SCRAPE_S}s"
    cfg["global"]["evaluation_interval"] = f"{SCRAPE_S}s"
    (job,) = cfg["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{triton_server.metrics_port}"]}]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    (port,) = launcher.free_ports(1)
    log = open(tmp / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h",
         f"--web.console.templates={tmp}", f"--web.console.libraries={tmp}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited {proc.returncode}:\n{(tmp / 'prometheus.log').read_text()[-3000:]}",
                            pytrace=False)
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready within 30 s:\n{(tmp / 'prometheus.log').read_text()[-3000:]}",
                            pytrace=False)
            time.sleep(0.2)
        prom = Prometheus(base)
        prom.log_path = tmp / "prometheus.log"
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


# -- the dashboard ----------------------------------------------------------------------------------

def dashboard_targets(dash: dict) -> list[tuple[dict, dict]]:
    """(panel, target) for every query of every panel, rows' nested panels included."""
    out = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p, t))

    walk(dash["panels"])
    return out


def regex_escape(value: str) -> str:
    """A single value of a multi-value variable as Grafana's Prometheus data source puts it into a
    =~ matcher: regex-escaped, the backslashes doubled for the PromQL string literal."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def substitute(expr: str, values: dict[str, str]) -> str:
    values = {**values, "__rate_interval": RATE_INTERVAL, "__interval": f"{SCRAPE_S}s"}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("[[" + name + "]]", values[name])
        expr = re.sub(r"\$" + re.escape(name) + r"\b", lambda _m: values[name], expr)
    assert "$" not in expr, f"unresolved template variable in {expr}"
    return expr


def resolve_variable(prom: Prometheus, var: dict, values: dict[str, str]) -> list[str]:
    """The values of a query variable `label_values(selector, label)`, read as Grafana does."""
    q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_]\w*)\)\s*", q)
    assert m, f"variable {var['name']}: only label_values(selector, label) is supported here: {q}"
    selector = substitute(m.group(1), values)
    series = prom.api("series", **{"match[]": selector})
    return sorted({s[m.group(2)] for s in series if m.group(2) in s})


def _load(url: str, stop: threading.Event, counts: list, errors: list, i: int) -> None:
    n = 0
    while not stop.is_set():
        try:
            llm_stream(url, f"{PREFIX}Question {i}.{n}: what is the weather like today?", stream=True,
                       sampling_parameters={"temperature": "0", "max_tokens": str(4 + (n * 5 + i) % 9),
                                            "ignore_eos": "true"}, timeout=60).raise_for_error()
            counts[i] += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(repr(e))
            return
        n += 1


def test_every_dashboard_query_has_data(prometheus, triton_server):
    t_start = time.monotonic()
    dash = json.loads(DASHBOARD.read_text())
    targets = dashboard_targets(dash)
    assert len(targets) >= 15, f"dashboard has only {len(targets)} queries"

    # Prometheus sees the server before the load starts (the rates need samples on both sides)
    deadline = time.monotonic() + 15
    while not any(s["value"][1] == "1" for s in prometheus.instant('up{job="triton-llm"}')):
        assert time.monotonic() < deadline, f"target not up in Prometheus: {prometheus.api('targets')}"
        time.sleep(0.25)
    load_started = time.time()
    load_start = load_started - 2 * SCRAPE_S  # the query window opens two scrapes before the load
    stop, counts, errors = threading.Event(), [0] * CLIENTS, []
    threads = [threading.Thread(target=_load, args=(triton_server.grpc_url, stop, counts, errors, i), daemon=True)
               for i in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        time.sleep(LOAD_S / 2)
        for _ in range(INVALID):
            r = llm_stream(triton_server.grpc_url, "x", sampling_parameters='{"temperature": "hot"}', timeout=30)
            assert r.error is not None, "a request with temperature 'hot' was not refused"
        time.sleep(LOAD_S / 2)
    finally:  # the clients stop whatever happens: the server is shared with the other tests
        stop.set()
        for t in threads:
            t.join(70)
    assert not errors, errors
    assert sum(counts) >= CLIENTS, f"only {sum(counts)} requests finished in {LOAD_S} s"
    time.sleep(2.5 * SCRAPE_S)  # the last scrape after the load
    end = time.time()

    # template variables, in order (later ones may use earlier ones); "All" = allValue, else all values
    values: dict[str, str] = {}
    choices: dict[str, list[str]] = {}
    for var in dash.get("templating", {}).get("list", []):
        if var["type"] == "datasource":
            values[var["name"]] = "prometheus"
            continue
        assert var["type"] == "query", f"unsupported variable type {var['type']} ({var['name']})"
        got = resolve_variable(prometheus, var, values)
        assert got, f"dashboard variable {var['name']} has no values in Prometheus ({var['query']})"
        choices[var["name"]] = got
        if var.get("includeAll"):
            values[var["name"]] = var.get("allValue") or "(" + "|".join(regex_escape(v) for v in got) + ")"
        else:
            values[var["name"]] = regex_escape(got[0]) if var.get("multi") else got[0]
    one_server = {**values, "instance": regex_escape(choices["instance"][0])} if "instance" in choices else None

    empty, report = [], []
    for panel, target in targets:
        series_out = []
        for vals in filter(None, (values, one_server)):
            expr = substitute(target["expr"], vals)
            result = prometheus.query_range(expr, load_start, end, SCRAPE_S)
            finite = [float(v) for s in result for _, v in s["values"] if math.isfinite(float(v))]
            if not finite:
                empty.append(f"{panel['title']} [{target['refId']}]: {expr} -> "
                             f"{'no series' if not result else 'only NaN / Inf'}")
            if vals is values:
                series_out = result
                report.append((panel["title"], target["refId"], expr, len(result), max(finite) if finite else None))
        target["_result"] = series_out
    for title, ref, expr, n, vmax in report:
        print(f"{title} [{ref}] {n} series, max {vmax if vmax is None else round(vmax, 4)}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
    peak = {title: vmax for title, _, _, _, vmax in report}
    assert peak["Prefix cache hit rate"] > 0, "the shared prompt prefix found no prefix-cache hits"
    assert peak["Rejected requests"] > 0, f"the {INVALID} refused requests do not show in the rejections panel"

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "dashboard": str(DASHBOARD.relative_to(REPO)), "scrape_interval_s": SCRAPE_S, "rate_interval": RATE_INTERVAL,
        "load": {"clients": CLIENTS, "seconds": LOAD_S, "requests": sum(counts)},
        "start": load_start, "load_started": load_started, "end": end, "variables": values,
        "panels": [{"title": p["title"], "unit": p.get("fieldConfig", {}).get("defaults", {}).get("unit", ""),
                    "targets": [{"refId": t["refId"], "legend": t.get("legendFormat", ""),
                                 "expr": substitute(t["expr"], values), "result": t.get("_result", [])}
                                for t in p.get("targets", []) if t.get("expr")]}
                   for p in dash["panels"]],
    }, indent=1))
    print(f"{len(targets)} queries with data; {sum(counts)} requests; test {time.monotonic() - t_start:.1f} s")
