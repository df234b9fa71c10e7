"""deploy/kubernetes/ checked offline (no cluster, no network).

- Every manifest parses; the core kinds pass kubernetes-validate's strict schema check (the package
  bundles the Kubernetes JSON schemas; strict = unknown fields are errors, like `kubectl apply
  --validate=strict`) for the oldest and the newest Kubernetes version named below.
- ServiceMonitor and InferencePool are custom resources: they are validated against their CRD's
  OpenAPI schema, vendored in tests/deploy/crd_schemas/ (source URL and release inside each file),
  made strict the same way; the CRDs' CEL rules (x-kubernetes-validations), which no offline validator
  here runs, have Python equivalents below, and a rule without one fails the test.
- The container command is the Makefile's `serve` recipe (what README's `make serve` runs, and the
  image's CMD), the ports and environment are the ones scripts/serve.sh reads, the grace period covers
  the launcher's drain, the objects refer to each other correctly, and the ServiceMonitor relabels as
  deploy/prometheus/prometheus.yml does.
- On the session's real tritonserver: every probe path of the Deployments answers 200 on the port it
  names, the ServiceMonitor's path serves the series the HPA's adapter rule reads, and the startup
  probe allows for the measured start-up.
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S_DIR = REPO / "deploy" / "kubernetes"
CRD_DIR = Path(__file__).resolve().parent / "crd_schemas"
SERVE_SH = REPO / "scripts" / "serve.sh"
SHUTDOWN_PY = REPO / "backend" / "paddle_llm_launcher" / "shutdown.py"
# Where the environment variables a Deployment sets must be read (else the setting does nothing).
ENV_READERS = [SERVE_SH, REPO / "scripts" / "launch_triton.py",
               *sorted((REPO / "backend" / "paddle_llm_launcher").glob("*.py")),
               REPO / "backend" / "paddle_llm_openai" / "cli.py"]
# Oldest Kubernetes the manifests are meant for (every field used is GA there) and the newest schema
# kubernetes-validate bundles.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())
# serve.sh's port variables by the container port names of the Deployments
PORT_VARS = {"http": "HTTP_PORT", "grpc": "GRPC_PORT", "metrics": "METRICS_PORT", "openai": "OPENAI_PORT"}
EXPECTED_KINDS = {"Deployment": 2, "Service": 2, "PersistentVolumeClaim": 1, "HorizontalPodAutoscaler": 1,
                  "ServiceMonitor": 1, "InferencePool": 1}


def load_manifests() -> list[tuple[str, dict]]:
    """(file name, object) for every YAML document in deploy/kubernetes/*.yaml (the Helm values
    under prometheus-adapter/ are not manifests)."""
    out = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


MANIFESTS = load_manifests()


def objects(kind: str) -> list[dict]:
    """The manifests' objects of one kind."""
    return [doc for _, doc in MANIFESTS if doc.get("kind") == kind]


def crd_documents() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the vendored CRD schema document."""
    docs = {}
    for path in sorted(CRD_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        docs[(doc["apiVersion"], doc["kind"])] = doc
    return docs


CRDS = crd_documents()


def container(deployment: dict) -> dict:
    """The Deployment's one container (the server)."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{deployment['metadata']['name']}: one container expected"
    return containers[0]


def deployment_env(deployment: dict) -> dict[str, str]:
    """The container's env as name -> value (a value from a Secret: "<secret>")."""
    return {e["name"]: e.get("value", "<secret>") for e in container(deployment).get("env", [])}


def serve_sh_port_defaults() -> dict[str, int]:
    """serve.sh's `--http-port "${HTTP_PORT:-8000}"` lines as {"HTTP_PORT": 8000, ...}."""
    found = re.findall(r'--[a-z-]+-port "\$\{([A-Z_]+):-(\d+)\}"', SERVE_SH.read_text())
    return {var: int(default) for var, default in found}


def expected_port(deployment: dict, name: str) -> int:
    """The port serve.sh gives the named role in this Deployment: its env value, else serve.sh's default."""
    var = PORT_VARS[name]
    env = deployment_env(deployment)
    return int(env[var]) if var in env else serve_sh_port_defaults()[var]


def probes(deployment: dict) -> dict[str, dict]:
    """startupProbe / readinessProbe / livenessProbe of the server container."""
    c = container(deployment)
    return {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}


# ---- parsing and schemas -------------------------------------------------------------------------

def test_every_manifest_parses_with_the_expected_kinds():
    kinds: dict[str, int] = {}
    for name, doc in MANIFESTS:
        assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), name
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), name
        kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
    assert kinds == EXPECTED_KINDS


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_pass_the_kubernetes_schema(version):
    checked = 0
    for name, doc in MANIFESTS:
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{name}: {doc['kind']} invalid for Kubernetes {version} at "
                        f"{'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{name}: {e.message} (a custom resource needs its CRD schema in {CRD_DIR})")
        checked += 1
    assert checked == len(MANIFESTS) - len(CRDS), "every object not covered by a vendored CRD schema"


def strict_json_schema(node):
    """A CRD's structural OpenAPI v3 schema as a JSON Schema (draft 4) that jsonschema can run, strict
    like the API server with field validation Strict: objects with `properties` reject unknown fields
    unless x-kubernetes-preserve-unknown-fields; x-kubernetes-int-or-string accepts an integer or a
    string; nullable admits null."""
    if isinstance(node, list):
        return [strict_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("enum", "default", "required") else strict_json_schema(v)) for k, v in node.items()}
    if "properties" in node:
        out["properties"] = {name: strict_json_schema(s) for name, s in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    return out


# The CEL rules of the vendored CRDs, as Python: rule text -> check(value at the rule's node).
CEL_EQUIVALENTS = {
    # InferencePool spec.endpointPickerRef
    "self.kind != 'Service' || has(self.port)":
        lambda ref: ref.get("kind", "Service") != "Service" or "port" in ref,
    # InferencePool spec.targetPorts
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))":
        lambda ports: all(sum(1 for p2 in ports if p2["number"] == p1["number"]) == 1 for p1 in ports),
}


def cel_failures(schema: dict, value, path: str = "") -> list[str]:
    """Evaluate the schema's x-kubernetes-validations on the value, where both exist; a rule without a
    Python equivalent is a failure too (it would go unchecked)."""
    failures = []
    for rule in schema.get("x-kubernetes-validations", []):
        check = CEL_EQUIVALENTS.get(rule["rule"])
        if check is None:
            failures.append(f"{path or '.'}: CEL rule without an offline equivalent: {rule['rule']}")
        elif not check(value):
            failures.append(f"{path or '.'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                failures += cel_failures(sub, value[name], f"{path}.{name}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            failures += cel_failures(schema["items"], item, f"{path}[{i}]")
    return failures


@pytest.mark.parametrize("kind", ["ServiceMonitor", "InferencePool"])
def test_custom_resources_pass_their_vendored_crd_schema(kind):
    (obj,) = objects(kind)
    crd = CRDS[(obj["apiVersion"], kind)]
    assert crd["release"] in crd["source"], "the source URL names the release the schema was taken from"
    schema = strict_json_schema(crd["openAPIV3Schema"])
    validator = jsonschema.Draft4Validator(schema)
    errors = [f"{'.'.join(map(str, e.path)) or '.'}: {e.message}" for e in validator.iter_errors(obj)]
    errors += cel_failures(crd["openAPIV3Schema"], obj)
    assert not errors, f"{kind} against {crd['crd']} {crd['release']}:\n" + "\n".join(errors)


def test_the_strict_crd_check_catches_a_misspelt_field():
    """The vendored-schema path is not vacuous: an unknown field, a missing required one and a CEL
    violation are all reported."""
    (pool,) = objects("InferencePool")
    crd = CRDS[(pool["apiVersion"], "InferencePool")]
    validator = jsonschema.Draft4Validator(strict_json_schema(crd["openAPIV3Schema"]))
    bad = json.loads(json.dumps(pool))
    bad["spec"]["targetPort"] = bad["spec"].pop("targetPorts")
    assert {e.validator for e in validator.iter_errors(bad)} >= {"additionalProperties", "required"}
    dup = json.loads(json.dumps(pool))
    dup["spec"]["targetPorts"] = dup["spec"]["targetPorts"] * 2
    assert any("unique" in f for f in cel_failures(crd["openAPIV3Schema"], dup))


# ---- the container runs what the README runs -----------------------------------------------------

def serve_recipe() -> list[str]:
    """The Makefile's `serve` target recipe (one command), split like a shell would."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(r"^serve\s*:", l))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    assert len(recipe) == 1, f"Makefile serve recipe: {recipe}"
    return shlex.split(recipe[0])


def dockerfile(deployment: dict) -> str:
    """The Dockerfile whose image the Deployment runs (docker/Dockerfile.cpu or .gcu, by image tag)."""
    tag = container(deployment)["image"].rsplit(":", 1)[1]
    return (REPO / "docker" / f"Dockerfile.{tag}").read_text()


def test_readme_serve_command_is_the_makefile_recipe():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^make serve\b", section, re.M), "README's two commands start the server with make serve"
    assert serve_recipe() == ["bash", "scripts/serve.sh"]


@pytest.mark.parametrize("deployment", objects("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_container_command_is_the_serve_command(deployment):
    c = container(deployment)
    assert c["command"] + c.get("args", []) == serve_recipe()
    text = dockerfile(deployment)
    workdir = re.findall(r"^WORKDIR\s+(\S+)", text, re.M)[-1]
    assert c["workingDir"] == workdir, "serve.sh is run relative to the image's WORKDIR"
    cmd = json.loads(re.findall(r"^CMD\s+(\[.*\])\s*$", text, re.M)[-1])
    assert cmd == serve_recipe(), "the image's own CMD runs the same command"


@pytest.mark.parametrize("deployment", objects("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_ports_and_environment_are_the_ones_serve_sh_reads(deployment):
    c = container(deployment)
    env = deployment_env(deployment)
    readers = "\n".join(p.read_text() for p in ENV_READERS)
    for name in env:
        assert re.search(r'(\$\{%s\b|["\']%s["\'])' % (name, name), readers), \
            f"{name} is read by neither serve.sh nor the launcher: setting it does nothing"
    bind = env.get("BIND_ADDRESS") or re.findall(r"^ENV\s+BIND_ADDRESS=(\S+)", dockerfile(deployment), re.M)[-1]
    assert bind == "0.0.0.0", "the server must listen beyond loopback for probes and the Service"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert set(ports) == set(PORT_VARS)
    for name, number in ports.items():
        assert number == expected_port(deployment, name), f"port {name}"
    volumes = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in deployment["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    (pvc,) = objects("PersistentVolumeClaim")
    assert claims == {"models": pvc["metadata"]["name"]}
    assert env["MODEL_DIR"].startswith(volumes["models"].rstrip("/") + "/"), "MODEL_DIR is on the models volume"


# ---- probes and drain ----------------------------------------------------------------------------

@pytest.mark.parametrize("deployment", objects("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_probes_use_the_health_endpoints(deployment):
    p = probes(deployment)
    assert p["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert p["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert p["startupProbe"]["httpGet"]["path"] in ("/v2/health/live", "/v2/health/ready")
    for probe in p.values():
        assert probe["httpGet"]["port"] == "http", "Triton's health endpoints are on its HTTP port"
    window = lambda probe: probe["periodSeconds"] * probe["failureThreshold"]  # noqa: E731
    # a tritonserver restart by the supervisor keeps the HTTP port closed for a whole model load
    assert window(p["livenessProbe"]) >= window(p["startupProbe"])


def drain_overheads() -> tuple[float, float, float]:
    """From paddle_llm_launcher/shutdown.py: the first drain request's timeout, the extra seconds past the grace
    period the stubs get, and the unload wait (what the drain takes beyond DRAIN_GRACE_S)."""
    src = SHUTDOWN_PY.read_text()
    ask = re.search(r'\{"type": "drain".*?timeout=([\d.]+)', src)
    extra = re.search(r"< grace_s \+ ([\d.]+)", src)
    unload = re.search(r"deadline = time\.monotonic\(\) \+ ([\d.]+)", src)
    assert ask and extra and unload, f"{SHUTDOWN_PY} changed: re-derive the drain's duration here"
    return float(ask.group(1)), float(extra.group(1)), float(unload.group(1))


def launcher_default(var: str) -> float:
    """serve.sh's default for one of its `${VAR:-N}` settings."""
    m = re.search(r"\$\{%s:-([\d.]+)\}" % var, SERVE_SH.read_text())
    assert m, f"serve.sh has no default for {var}"
    return float(m.group(1))


@pytest.mark.parametrize("deployment", objects("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_grace_period_covers_the_drain(deployment):
    env = deployment_env(deployment)
    spec = deployment["spec"]["template"]["spec"]
    pre_stop = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = float(env.get("DRAIN_GRACE_S", launcher_default("DRAIN_GRACE_S")))
    kill_after = float(env.get("TRITON_KILL_AFTER", launcher_default("TRITON_KILL_AFTER")))
    accept = float(env.get("DRAIN_ACCEPT_S", 0))  # the drain's optional accept window, when set
    ask, extra, unload = drain_overheads()
    worst = float(pre_stop[1]) + accept + ask + grace + extra + unload + kill_after
    assert spec["terminationGracePeriodSeconds"] >= worst, \
        f"terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']} < worst-case stop {worst:.0f} s"
    # and not far beyond it: a pod that hangs should not hold its node's resources for minutes
    assert spec["terminationGracePeriodSeconds"] <= worst + 30


# ---- the objects refer to each other -------------------------------------------------------------

def test_service_servicemonitor_and_pool_select_the_server_pods():
    services = {s["metadata"]["name"]: s for s in objects("Service")}
    svc, metrics_svc = services["paddle-llm"], services["paddle-llm-metrics"]
    (mon,) = objects("ServiceMonitor")
    (pool,) = objects("InferencePool")
    for dep in objects("Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert svc["spec"]["selector"].items() <= labels.items()
        assert metrics_svc["spec"]["selector"].items() <= labels.items()
        assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"]: p["containerPort"] for p in container(dep)["ports"]}
        assert {p["targetPort"] for s in (svc, metrics_svc) for p in s["spec"]["ports"]} <= set(ports)
        assert [p["number"] for p in pool["spec"]["targetPorts"]] == [ports["openai"]], \
            "the gateway speaks OpenAI: the pool targets the OpenAI frontend"
    # client traffic and metrics on separate Services: a client-facing route never carries the metrics
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 8000, "grpc": 8001, "openai": 9000}
    assert {p["name"]: p["port"] for p in metrics_svc["spec"]["ports"]} == {"metrics": 8002}
    assert mon["spec"]["selector"]["matchLabels"].items() <= metrics_svc["metadata"]["labels"].items()
    assert not mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e["port"] for e in mon["spec"]["endpoints"]] == ["metrics"]


@pytest.mark.parametrize("deployment", objects("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_the_api_key_comes_from_a_secret_and_the_admin_apis_stay_restricted(deployment):
    """The OpenAI key is never a literal in a manifest and a missing Secret stops the pod (no silent
    open API); the launcher's restricted-API list keeps model-repository and shared-memory closed."""
    from paddle_llm_launcher.admin_api import parse_apis

    env = {e["name"]: e for e in container(deployment)["env"]}
    ref = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert "value" not in env["VLLM_API_KEY"] and ref["optional"] is False
    apis = parse_apis((env.get("TRITON_RESTRICTED_APIS") or {}).get("value"))
    assert {"model-repository", "shared-memory"} <= set(apis)
    assert "TRITON_ADMIN_KEY" not in env, "the launcher makes a secret per start; none is needed here"


def adapter_rule() -> dict:
    """The prometheus-adapter rule that serves the HPA's metric."""
    values = yaml.safe_load((K8S_DIR / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    return rule


def adapter_series() -> str:
    """The Prometheus series name the adapter rule reads."""
    return re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)", adapter_rule()["seriesQuery"]).group(1)


def test_hpa_scales_a_deployment_on_the_adapters_waiting_metric():
    (hpa,) = objects("HorizontalPodAutoscaler")
    names = {d["metadata"]["name"] for d in objects("Deployment")}
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert hpa["spec"]["scaleTargetRef"]["name"] in names
    (metric,) = hpa["spec"]["metrics"]
    rule = adapter_rule()
    series = adapter_series()
    assert series == "vllm:num_requests_waiting"
    # the adapter's name rule (Go regexp, ${1} references) applied as Python's re would
    as_name = re.sub(r"\$\{(\d+)\}", r"\\\1", rule["name"]["as"])
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == re.sub(rule["name"]["matches"], as_name, series)
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}, \
        "the ServiceMonitor's target labels tie each series to its pod"


def test_servicemonitor_relabels_as_the_prometheus_config():
    prom = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "triton-llm"]
    camel = lambda key: re.sub(r"_([a-z])", lambda m: m.group(1).upper(), key)  # noqa: E731
    expected = [{camel(k): v for k, v in rule.items()} for rule in job["metric_relabel_configs"]]
    (mon,) = objects("ServiceMonitor")
    (endpoint,) = mon["spec"]["endpoints"]
    assert endpoint["metricRelabelings"] == expected
    assert endpoint["path"] == job["metrics_path"]
    assert endpoint["interval"] == prom["global"]["scrape_interval"]


# ---- against the real server ---------------------------------------------------------------------

def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


@pytest.mark.e2e
def test_probe_and_scrape_paths_answer_on_the_real_server(triton_server):
    by_role = {"http": triton_server.http_port, "grpc": triton_server.grpc_port,
               "metrics": triton_server.metrics_port}
    for dep in objects("Deployment"):
        ports = {p["name"]: p["containerPort"] for p in container(dep)["ports"]}
        for kind, probe in probes(dep).items():
            name = probe["httpGet"]["port"]
            assert ports[name] == expected_port(dep, name)   # the port serve.sh opens for that role
            status, body = http_get(f"http://127.0.0.1:{by_role[name]}{probe['httpGet']['path']}")
            assert status == 200, f"{dep['metadata']['name']} {kind} {probe['httpGet']['path']}: {status} {body!r}"
    (mon,) = objects("ServiceMonitor")
    (endpoint,) = mon["spec"]["endpoints"]
    status, text = http_get(f"http://127.0.0.1:{by_role[endpoint['port']]}{endpoint['path']}")
    assert status == 200
    series = adapter_series()
    assert re.search(r"^%s\{[^}]*engine=" % re.escape(series), text, re.M), \
        f"{series} (the HPA's metric, labelled by engine) is exported"
    # the relabelling's premise: the llm_* families carry the Triton instance as `instance`
    assert re.search(r'^llm_num_requests_waiting\{[^}]*\binstance="', text, re.M)


@pytest.mark.e2e
def test_startup_probe_allows_for_the_measured_start(triton_server, smollm2_dir):
    """The CPU Deployment serves the default model, the one the session server loads: its startup
    probe must allow at least twice the start-up measured here (on a busy 2-core host)."""
    (cpu,) = [d for d in objects("Deployment") if container(d)["image"].endswith(":cpu")]
    assert Path(deployment_env(cpu)["MODEL_DIR"]).name == Path(smollm2_dir).name
    startup = probes(cpu)["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    measured = triton_server.handle.ready_after
    assert measured is not None
    assert budget >= 2 * measured, f"startup probe allows {budget} s; this server took {measured:.1f} s"
