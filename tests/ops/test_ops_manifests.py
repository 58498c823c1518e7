"""The manifests name only what exists: images, sub-commands, flags, ports, probe paths,
streams and metrics are checked against the code (the real argument parsers, the real
metric registries, the key module), and the KEDA triggers use only the fields KEDA's
scalers read."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib

import pytest
import yaml
from redis_server import REPO

from gpu_worker.cli import build_parser as engine_parser
from gpu_worker.metrics import WorkerMetrics
from producer import exporter
from producer.cli import build_parser as producer_parser
from shared import keys

K8S = REPO / "ops" / "k8s"
CLUSTER = REPO / "ops" / "kustomize" / "overlays" / "redis-cluster"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"redis-llm-fleet:{VERSION}"
PROBE_PATHS = {"worker": {"/healthz", "/readyz", "/metrics"}, "exporter": {"/metrics"},
               "gateway": {"/health", "/ready"}}
# The metadata KEDA's scalers read (keda.sh/docs/latest/scalers/): anything else is a typo.
KEDA_FIELDS = {
    "prometheus": {"serverAddress", "query", "threshold", "activationThreshold",
                   "ignoreNullValues", "namespace", "customHeaders", "queryParameters",
                   "unsafeSsl", "authModes"},
    "redis-cluster-streams": {"addresses", "hosts", "ports", "addressesFromEnv", "hostsFromEnv",
                              "portsFromEnv", "usernameFromEnv", "passwordFromEnv", "stream",
                              "consumerGroup", "pendingEntriesCount", "streamLength", "lagCount",
                              "activationLagCount", "enableTLS", "unsafeSsl"},
}


def _docs() -> list[dict]:
    """The objects of ops/k8s/*.yaml (not kustomize's own file)."""
    return [d for f in sorted(K8S.glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]


def _containers() -> list[tuple[dict, dict]]:
    """(workload, container) for every pod template."""
    return [(d, c) for d in _docs() if d["kind"] in ("Deployment", "StatefulSet")
            for c in d["spec"]["template"]["spec"]["containers"]]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def metric_names() -> set[str]:
    """Every sample name the worker, the gateway and the exporter can expose."""
    from producer.gateway.metrics import GatewayMetrics

    names = set()
    families = [*WorkerMetrics("x").registry.collect(), *GatewayMetrics().registry.collect()]
    for family in families:
        suffixes = {"counter": ["_total"], "histogram": ["", "_bucket", "_count", "_sum"]}
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
    lanes = {lane: {"length": 0, "lag": 0, "pending": 0, "consumers": 0} for lane in keys.LANES}
    report = {"model": "x", "dead_letters": 0, "workers": {}, "tenants": {"acme": lanes},
              "legacy": lanes, "streams": lanes, "invalid_tenants": []}
    names |= {f.name for f in exporter.families([report])}
    return names | {"fleet:queue_up", "fleet:exporter_scrape_seconds"}


def test_core_manifests_pass_kubernetes_validate():
    kv = pytest.importorskip("kubernetes_validate")
    checked = 0
    for doc in _docs():
        if doc["apiVersion"].startswith(("keda.sh/", "monitoring.coreos.com/")):
            continue  # CRDs: ops/kustomize/schemas (tests/ops/test_ops_deploy.py)
        kv.validate(doc, kv.latest_version(), strict=True)
        checked += 1
    assert checked >= 10


def test_containers_run_real_commands_flags_and_ports():
    seen = set()
    for workload, container in _containers():
        if container["image"].startswith("redis:"):
            continue  # the Redis server itself (ops/k8s/redis.yaml)
        assert container["image"] == IMAGE
        args = container["args"]
        command = args[0]
        seen.add(command)
        parser = engine_parser() if command == "worker" else producer_parser()
        parser.parse_args(args)  # exits (fails the test) on any flag the CLI lacks
        port = int(_flag(args, "--metrics-port" if command == "worker" else "--port"))
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert port in named.values()
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container.get(kind, {}).get("httpGet")
            if probe:
                assert probe["path"] in PROBE_PATHS[command]
                assert named[probe["port"]] == port
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if "prometheus.io/port" in annotations:
            assert int(annotations["prometheus.io/port"]) == port
        if command == "worker":
            grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            assert grace > float(_flag(args, "--drain-grace-s")) + 10  # + the hand-back wait
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert seen == {"worker", "gateway", "exporter"}


def test_probe_paths_exist_in_the_code():
    health = (REPO / "gpu_worker" / "health.py").read_text()
    assert '"/healthz"' in health and '"/readyz"' in health and '"/metrics"' in health
    app = (REPO / "producer" / "gateway" / "app.py").read_text()
    assert 'Route("/health"' in app and 'Route("/ready"' in app


def _worker_model() -> str:
    workers = [c for _, c in _containers() if c["args"][0] == "worker"]
    return _flag(workers[0]["args"], "--model-name")


def _scaled_object(docs: list[dict]) -> dict:
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    assert scaled["spec"]["minReplicaCount"] == 0
    workers = [w for w, c in _containers() if c["args"][0] == "worker"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == workers[0]["metadata"]["name"]
    for trigger in scaled["spec"]["triggers"]:
        assert set(trigger["metadata"]) <= KEDA_FIELDS[trigger["type"]], trigger
    return scaled


def test_keda_scales_from_zero_on_the_exporters_backlog():
    spec = _scaled_object([d for d in _docs() if d["apiVersion"].startswith("keda.sh/")])["spec"]
    model = _worker_model()
    exporter_args = next(c["args"] for _, c in _containers() if c["args"][0] == "exporter")
    assert model in _flag(exporter_args, "--models").split(",")
    queries = {}
    for trigger in spec["triggers"]:
        meta = trigger["metadata"]
        assert trigger["type"] == "prometheus" and meta["serverAddress"].startswith("http")
        assert meta["activationThreshold"] == "0"  # one waiting request wakes the fleet
        assert meta["ignoreNullValues"] == "false"  # an unreadable queue is not an empty one
        named = set(re.findall(r"fleet:[a-z_]+", meta["query"]))
        assert named and named <= metric_names(), meta["query"]
        assert f'model_name="{model}"' in meta["query"]
        queries[trigger["name"]] = meta["query"]
    assert queries["backlog"] == f'sum(fleet:queue_backlog{{model_name="{model}"}})'
    assert spec["fallback"]["replicas"] >= 1  # what KEDA holds while the queue is unreadable


def test_keda_cluster_variant_triggers_on_tenant_streams():
    docs = [d for f in ("keda-scaledobject.yaml", "trigger-auth.yaml")
            for d in yaml.safe_load_all((CLUSTER / f).read_text()) if d]
    scaled = _scaled_object(docs)
    main_scaled = next(d for d in _docs() if d["kind"] == "ScaledObject")
    assert scaled["metadata"] == main_scaled["metadata"]  # it replaces the primary one
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    secrets = {d["metadata"]["name"]: d for d in _docs() if d["kind"] == "Secret"}
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["parameter"] in {"username", "password", "tls", "ca"}
        assert ref["key"] in secrets[ref["name"]]["stringData"]
    redis_port = next(p["port"] for d in _docs() if d["kind"] == "Service"
                      and d["metadata"]["name"] == "redis" for p in d["spec"]["ports"])
    by_stream: dict[str, set[str]] = {}
    for trigger in scaled["spec"]["triggers"]:
        meta = trigger["metadata"]
        assert trigger["type"] == "redis-cluster-streams" and meta["consumerGroup"] == keys.GROUP
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
        assert all(a.rsplit(":", 1)[1] == str(redis_port) for a in meta["addresses"].split(","))
        by_stream.setdefault(meta["stream"], set()).update(
            k for k in ("lagCount", "pendingEntriesCount") if k in meta)
        if "lagCount" in meta:
            assert meta["activationLagCount"] == "0"
    model = _worker_model()
    expected = {keys.stream_key(model, "acme", "high"), keys.stream_key(model, "acme", "default"),
                keys.stream_key(model, "globex", "batch")}
    assert by_stream == {s: {"lagCount", "pendingEntriesCount"} for s in expected}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_keda_queries_are_valid_promql(tmp_path):
    spec = next(d for d in _docs() if d["kind"] == "ScaledObject")["spec"]
    rules = {"groups": [{"name": "keda", "rules": [
        {"record": f"keda:{t['name'].replace('-', '_')}", "expr": t["metadata"]["query"]}
        for t in spec["triggers"]]}]}
    (tmp_path / "keda.yml").write_text(yaml.safe_dump(rules))
    done = subprocess.run(["promtool", "check", "rules", str(tmp_path / "keda.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_matches_the_code():
    text = (REPO / "ops" / "Dockerfile").read_text()
    assert re.search(r"^FROM nvidia/cuda:[\w.\-]+runtime", text, re.M)
    assert 'ENTRYPOINT ["tini", "--", "fleet"]' in text
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))
    engine_parser().parse_args(cmd)
    exposed = set(re.search(r"^EXPOSE (.+)$", text, re.M).group(1).split())
    ports = {str(p["containerPort"]) for _, c in _containers() if c["image"] == IMAGE
             for p in c["ports"]}
    assert ports <= exposed
    assert "USER 10001" in text and 'VOLUME ["/models"]' in text
    assert "FLEET_CACHE_DIR" in (REPO / "gpu_worker" / "model" / "default_model.py").read_text()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "fleet" in scripts


@pytest.mark.parametrize("path", ["ops/prometheus/alerts.yml", "ops/grafana/fleet-dashboard.json",
                                  "docs/operations.md", "ops/k8s/keda-scaledobject.yaml"])
def test_only_existing_metrics_are_named(path):
    text = (REPO / path).read_text()
    named = set(re.findall(r"fleet:[a-z][a-z0-9_]*(?::[a-z0-9_]+)*", text))
    named = {n for n in named if not n.startswith(("fleet:default", "fleet:req", "fleet:gateway:"))
             and n != "fleet:gateway"}  # key names (the gateway's quota keys), not metrics
    assert named, path
    assert named <= metric_names(), sorted(named - metric_names())


def test_dashboard_is_what_the_generator_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_dashboard",
                                                  REPO / "ops" / "grafana" / "build_dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (REPO / "ops" / "grafana" / "fleet-dashboard.json").read_text() == module.render()
    panels = json.loads(module.render())["panels"]
    shown = {m for p in panels for t in p.get("targets", [])
             for m in re.findall(r"fleet:[a-z0-9_]+", t["expr"])}
    worker = {f.name for f in WorkerMetrics("x").registry.collect()}
    assert {re.sub(r"_(total|bucket)$", "", m) for m in shown} >= worker  # a panel for each


def test_the_image_has_the_c_compiler_triton_and_the_cpu_kernels_need():
    # Triton builds each kernel's launcher with the system C compiler and Python's headers at
    # first launch; without them every GPU start fails ("Failed to find C compiler").
    install = re.search(r"apt-get install[^\n]*(?:\n[^\n]*\\\n?)*[^\n]*", (REPO / "ops" / "Dockerfile").read_text())
    packages = set(install.group(0).replace("\\", " ").split())
    assert {"gcc", "libc6-dev", "python3-dev"} <= packages


def test_fleet_containers_log_json_lines():
    """Worker, gateway and exporter pods log one JSON object per line (LOG_FORMAT is what
    their --log-format defaults to), and the value is one the parsers take."""
    from shared.logs import FORMATS

    fleet = [c for _, c in _containers() if c.get("args", [""])[0] in ("worker", "gateway", "exporter")]
    assert {c["args"][0] for c in fleet} == {"worker", "gateway", "exporter"}
    for c in fleet:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env.get("LOG_FORMAT") == "json" and "json" in FORMATS, c["name"]
